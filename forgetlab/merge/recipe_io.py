"""A merge recipe from anything — a Recipe, a dict, YAML text or a recipe file — in either dialect: forgetlab's
(`method`, forgetlab.merge.recipes) or mergekit's (`merge_method`, forgetlab.merge.mergekit_yaml), detected from
its keys; a file's relative model paths are read from the file's folder. And a recipe written as mergekit YAML
(forgetlab.merge.mergekit_export)."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import yaml

from forgetlab.core.checkpoints import looks_like_hub_id
from forgetlab.core.errors import ParameterError
from forgetlab.core.yamlio import YamlError, load_file, safe_load
from forgetlab.merge.mergekit_export import to_mergekit
from forgetlab.merge.mergekit_yaml import from_mergekit
from forgetlab.merge.recipes import TOKENIZER_SOURCES, Recipe


def is_mergekit(d: Mapping[str, Any]) -> bool:
    """A YAML dict is a mergekit recipe when it has `merge_method` (ours has `method`)."""
    return isinstance(d, Mapping) and "merge_method" in d


def load_recipe(source: str | Path | Mapping[str, Any] | Recipe) -> Recipe:
    """A Recipe from a Recipe, a dict, a YAML string or a recipe file; the format (ours or mergekit's) is detected
    from the keys. A one-line string is a file path: a path that exists is read as a file whatever its name
    (`recipe.yaml`, `recipe.txt`, `recipe`); a folder, a file that is not UTF-8 text, or a missing file is a
    message naming it."""
    if isinstance(source, Recipe):
        return source
    if isinstance(source, Mapping):
        return _from_any(source)
    text = str(source)
    if isinstance(source, Path) or "\n" not in text:
        path = Path(text).expanduser()
        if path.is_dir():
            inside = path / "recipe.yaml"
            hint = (f"this folder holds {inside} (a merge writes its recipe there): give that file" if inside.is_file()
                    else "give the recipe's YAML file, not a folder")
            raise ParameterError(f"The recipe {path} is a folder; {hint}.")
        if path.exists():
            d = load_file(path, "recipe")
            if not isinstance(d, Mapping):
                raise ParameterError(f"The recipe {path} must be a YAML mapping (forgetlab's method/base/models/params "
                                     f"or mergekit's merge_method/base_model/models); it holds "
                                     f"{'nothing' if d is None else 'a ' + type(d).__name__}.")
            return resolve_paths(_from_any(d), path.resolve().parent, f"the recipe {path}")
        try:
            d = safe_load(text, "The recipe")
        except YamlError:
            if text.lstrip().startswith("{"):  # a one-line YAML mapping with a mistake in it
                raise
            d = None
        if not isinstance(d, Mapping):  # a file name, not YAML text
            raise ParameterError(f"Recipe file {path} does not exist. Check the path (relative paths start in the "
                                 f"current folder, {Path.cwd()}).")
        return _from_any(d)
    return _from_any(safe_load(text, "The recipe"))


def _from_any(d: Any) -> Recipe:
    """Our recipe dict or mergekit's (detected by `merge_method`)."""
    return from_mergekit(d) if is_mergekit(d) else Recipe.from_dict(d)


def resolve_paths(recipe: Recipe, folder: Path, where: str) -> Recipe:
    """Make the recipe's relative model paths relative to `folder` (the recipe file's folder, as a pool file's
    paths are relative to the pool file); hub ids stay as they are; a path that exists nowhere is refused with
    the folder it was resolved against. `base+adapter` references are resolved part by part."""
    def one(ref: str) -> str:
        p = Path(ref).expanduser()
        if p.is_absolute():
            return str(p)
        cand = folder / p
        if cand.exists():
            return str(cand)
        if looks_like_hub_id(ref):
            return ref
        raise ParameterError(f"{ref!r} in {where} does not exist (relative paths are resolved against the "
                             f"recipe's folder, {folder}). Fix the path or give an absolute one.")

    def ref(value: str) -> str:
        model, sep, adapter = str(value).rpartition("+")
        if sep and model and adapter and not (folder / str(value)).exists():
            return f"{one(model)}+{one(adapter)}"
        return one(str(value))

    recipe.base = ref(recipe.base)
    for m in recipe.models:
        m.model = ref(m.model)
    for sl in recipe.slices or []:
        for s in sl.sources:
            s.model = ref(s.model)
    if recipe.tokenizer and recipe.tokenizer["source"] not in TOKENIZER_SOURCES:
        recipe.tokenizer["source"] = ref(recipe.tokenizer["source"])
    if recipe.pool:
        recipe.pool = one(str(recipe.pool))
    return recipe


def mergekit_yaml(recipe: Recipe) -> str:
    """mergekit YAML text for a recipe (forgetlab.merge.mergekit_export.to_mergekit)."""
    return yaml.safe_dump(to_mergekit(recipe), sort_keys=False)
