"""Papers behind a trained model, as BibTeX, for model cards and READMEs.

Each method's paper is in its record (`MethodInfo.paper`, next to its trainer); this module adds TRL's and lists
what a card cites. Every entry names only fields checked against the paper's arXiv listing; a field we could not
check is left out rather than guessed (so some entries carry no venue). Keys are stable: cards and docs may cite them.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from ..methods import Paper, base_method, method_infos, registered_papers, shapings

__all__ = ["Paper", "PAPERS", "TRL_PAPER", "papers_for", "bibtex_for"]

#: The library every method runs in.
TRL_PAPER = Paper(
    "vonwerra2020trl",
    "TRL: Transformer Reinforcement Learning",
    "von Werra et al., 2020",
    "https://github.com/huggingface/trl",
    "\n".join([
        "@misc{vonwerra2020trl,",
        "  title        = {{TRL: Transformer Reinforcement Learning}},",
        "  author       = {Leandro von Werra and Younes Belkada and Lewis Tunstall and Edward Beeching and "
        "Tristan Thrush and Nathan Lambert and Shengyi Huang and Kashif Rasul and Quentin Gallou{\\'e}dec},",
        "  year         = {2020},",
        "  howpublished = {\\url{https://github.com/huggingface/trl}}",
        "}",
    ]),
)


class _Papers(Mapping):
    """`{BibTeX key: Paper}`: every registered method's and shaping's paper (their records, `exploration_trl.methods`)
    and TRL's; always current."""

    def _all(self) -> dict[str, Paper]:
        return {**registered_papers(), TRL_PAPER.key: TRL_PAPER}

    def __getitem__(self, key: str) -> Paper:
        return self._all()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())


PAPERS: Mapping[str, Paper] = _Papers()


def papers_for(method: str | None, still: bool = False) -> list[Paper]:
    """Papers a card trained with `method` cites: each method part, the shapings when they were on (`still`), the
    base method (GRPO) and TRL."""
    infos = method_infos(method)
    if still:
        infos += shapings()
    papers = [info.paper for info in infos] + [base_method().paper, TRL_PAPER]
    return list({p.key: p for p in papers}.values())


def bibtex_for(method: str | None, still: bool = False) -> str:
    """All BibTeX entries for `method`, separated by blank lines."""
    return "\n\n".join(p.bibtex for p in papers_for(method, still=still))
