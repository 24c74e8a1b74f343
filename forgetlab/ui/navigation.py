"""The app's pages: a fixed order, listed only when their file exists under views/."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class PageSpec:
    """One page of the app: file stem under views/, navigation title, icon."""

    stem: str
    title: str
    icon: str


PAGE_ORDER = (
    PageSpec("models", "Models", ":material/hub:"),
    PageSpec("linearity", "Linearity", ":material/show_chart:"),
    PageSpec("forgetting", "Forgetting", ":material/trending_down:"),
    PageSpec("features", "Features", ":material/scatter_plot:"),
    PageSpec("merge", "Merge", ":material/merge:"),
    PageSpec("finetune", "Fine-tune", ":material/model_training:"),
    PageSpec("runs", "Runs", ":material/history:"),
)


def existing_pages(pages_dir: str | Path) -> list[PageSpec]:
    """The pages of PAGE_ORDER whose `<pages_dir>/<stem>.py` exists, in that order."""
    root = Path(pages_dir)
    return [p for p in PAGE_ORDER if (root / f"{p.stem}.py").is_file()]
