"""Papers behind each method, as BibTeX, for model cards and READMEs.

Every entry names only fields checked against the paper's arXiv listing; a field we could not check is
left out rather than guessed (so some entries carry no venue). Keys are stable: cards and docs may cite them.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Paper", "PAPERS", "METHOD_PAPERS", "papers_for", "bibtex_for", "method_parts"]


@dataclass(frozen=True)
class Paper:
    key: str  #: BibTeX key
    title: str
    short: str  #: how the card names it in prose ("Cui et al., 2025")
    url: str
    bibtex: str


def _arxiv(key: str, title: str, authors: list[str], year: int, eprint: str, primary: str | None = None) -> str:
    lines = [
        f"@misc{{{key},",
        f"  title         = {{{{{title}}}}},",
        f"  author        = {{{' and '.join(authors)}}},",
        f"  year          = {{{year}}},",
        f"  eprint        = {{{eprint}}},",
        "  archivePrefix = {arXiv},",
    ]
    if primary:
        lines.append(f"  primaryClass  = {{{primary}}},")
    lines.append(f"  url           = {{https://arxiv.org/abs/{eprint}}}")
    lines.append("}")
    return "\n".join(lines)


PAPERS: dict[str, Paper] = {}


def _add(key, title, short, authors, year, eprint, primary=None):
    url = f"https://arxiv.org/abs/{eprint}"
    PAPERS[key] = Paper(key, title, short, url, _arxiv(key, title, authors, year, eprint, primary))


_add(
    "li2026progrpo",
    "Back to Basics: Revisiting Exploration in Reinforcement Learning for LLM Reasoning via Generative Probabilities",
    "Li et al., 2026",
    ["Pengyi Li", "Elizaveta Goncharova", "Andrey Kuznetsov", "Ivan Oseledets"],
    2026,
    "2602.05281",
)
_add(
    "gai2025differential",
    "Differential Smoothing Mitigates Sharpening and Improves LLM Reasoning",
    "Gai et al., 2025",
    ["Jingchu Gai", "Guanning Zeng", "Huaqing Zhang", "Aditi Raghunathan"],
    2025,
    "2511.19942",
    "cs.LG",
)
_add(
    "peng2025casp",
    "Beyond the Sampled Token: Preserving Candidate Support in RLVR",
    "Peng et al., 2025",
    ["Ruotian Peng", "Yi Ren", "Zhouliang Yu", "Weiyang Liu", "Yandong Wen"],
    2025,
    "2510.14807",
    "cs.AI",
)
_add(
    "cui2025entropy",
    "The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models",
    "Cui et al., 2025",
    [
        "Ganqu Cui", "Yuchen Zhang", "Jiacheng Chen", "Lifan Yuan", "Zhi Wang", "Yuxin Zuo", "Haozhan Li",
        "Yuchen Fan", "Huayu Chen", "Weize Chen", "Zhiyuan Liu", "Hao Peng", "Lei Bai", "Wanli Ouyang", "Yu Cheng",
        "Bowen Zhou", "Ning Ding",
    ],
    2025,
    "2505.22617",
)
_add(
    "deng2025still",
    "From Trial-and-Error to Improvement: A Systematic Analysis of LLM Exploration Mechanisms in RLVR",
    "Deng et al., 2025 (STILL report)",
    [
        "Jia Deng", "Jie Chen", "Zhipeng Chen", "Daixuan Cheng", "Fei Bai", "Beichen Zhang", "Yinqian Min",
        "Yanzipeng Gao", "Wayne Xin Zhao", "Ji-Rong Wen",
    ],
    2025,
    "2508.07534",
)
_add(
    "shao2024deepseekmath",
    "DeepSeekMath: Pushing the Limits of Mathematical Reasoning in Open Language Models",
    "Shao et al., 2024",
    [
        "Zhihong Shao", "Peiyi Wang", "Qihao Zhu", "Runxin Xu", "Junxiao Song", "Xiao Bi", "Haowei Zhang",
        "Mingchuan Zhang", "Y. K. Li", "Y. Wu", "Daya Guo",
    ],
    2024,
    "2402.03300",
    "cs.CL",
)
_add(
    "chen2025passk",
    "Pass@k Training for Adaptively Balancing Exploration and Exploitation of Large Reasoning Models",
    "Chen et al., 2025",
    ["Zhipeng Chen", "Xiaobo Qin", "Youbin Wu", "Yue Ling", "Qinghao Ye", "Wayne Xin Zhao", "Guang Shi"],
    2025,
    "2508.10751",
)
_add(
    "walder2025pkpo",
    "Pass@K Policy Optimization: Solving Harder Reinforcement Learning Problems",
    "Walder and Karkhanis, 2025",
    ["Christian Walder", "Deep Karkhanis"],
    2025,
    "2505.15201",
)
_add(
    "he2025unlikely",
    "Rewarding the Unlikely: Lifting GRPO Beyond Distribution Sharpening",
    "He et al., 2025",
    ["Andre He", "Daniel Fried", "Sean Welleck"],
    2025,
    "2506.02355",
)
PAPERS["vonwerra2020trl"] = Paper(
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

#: method name -> (display name, one-line description, paper key)
METHOD_PAPERS: dict[str, tuple[str, str, str]] = {
    "grpo": (
        "GRPO",
        "Group Relative Policy Optimization: advantages are rewards normalised within the group of completions "
        "sampled for the same prompt.",
        "shao2024deepseekmath",
    ),
    "progrpo": (
        "ProGRPO (ARM)",
        "Advantage re-weighting: in groups with both right and wrong completions, over-confident completions "
        "(high confidence over their lowest-probability tokens) get smaller advantages and under-explored ones larger.",
        "li2026progrpo",
    ),
    "dsgrpo": (
        "DS-GRPO (differential smoothing)",
        "An entropy bonus on correct completions and an entropy penalty on wrong ones, through each completion's "
        "log-probability (`ds_logp_granularity`: the trajectory's sum by default, or per token, or the mean).",
        "gai2025differential",
    ),
    "casp": (
        "CaSP (Candidate-aware Support Preservation)",
        "At high-entropy forking tokens, positive updates are spread over the old policy's top-N candidate tokens, "
        "and a wrong top-1 sample is penalised more strongly.",
        "peng2025casp",
    ),
    "kl_cov": (
        "KL-Cov",
        "A KL penalty on the small fraction of tokens with the largest covariance between log-probability and "
        "advantage, which would otherwise drive entropy collapse.",
        "cui2025entropy",
    ),
    "clip_cov": (
        "Clip-Cov",
        "The policy gradient of a small random subset of high-covariance tokens is cut, slowing entropy collapse.",
        "cui2025entropy",
    ),
    "passk": (
        "Pass@k Training",
        "Analytic pass@k advantages: each completion gets the mean advantage of the k-subsets of its group that contain "
        "it, so wrong completions in groups that already pass are penalised less (k in the config).",
        "chen2025passk",
    ),
    "pkpo": (
        "PKPO (Pass@K Policy Optimization)",
        "An unbiased transform of the group's rewards whose policy gradient is that of pass@k (max@k for graded "
        "rewards), with a leave-one-out baseline and k optionally annealed toward 1.",
        "walder2025pkpo",
    ),
    "unlikely": (
        "Unlikeliness reward",
        "Correct completions are rewarded more the less likely the policy found them (rank within the group), so "
        "training does not only sharpen the distribution on solutions it already prefers.",
        "he2025unlikely",
    ),
    "still": (
        "STILL advantage shaping",
        "Perplexity-based shaping of each completion's advantage and a position bonus that grows along the response.",
        "deng2025still",
    ),
}


def method_parts(method: str | None) -> list[str]:
    """`'progrpo+casp'` -> `['progrpo', 'casp']` (lower-case, order kept, duplicates dropped)."""
    parts = [p.strip().lower() for p in str(method or "grpo").split("+") if p.strip()]
    return list(dict.fromkeys(parts)) or ["grpo"]


def papers_for(method: str | None, still: bool = False) -> list[Paper]:
    """Papers a card trained with `method` cites: each method part, STILL when its shapers were on, GRPO, TRL."""
    keys = [METHOD_PAPERS[p][2] for p in method_parts(method) if p in METHOD_PAPERS]
    if still:
        keys.append(METHOD_PAPERS["still"][2])
    keys += ["shao2024deepseekmath", "vonwerra2020trl"]
    return [PAPERS[k] for k in dict.fromkeys(keys)]


def bibtex_for(method: str | None, still: bool = False) -> str:
    """All BibTeX entries for `method`, separated by blank lines."""
    return "\n\n".join(p.bibtex for p in papers_for(method, still=still))
