"""`exploration-trl push`: write or update the model card of a trained folder and upload it to the Hub."""

from __future__ import annotations

import argparse

__all__ = ["register", "add_push_parser", "run_push_command"]


def add_push_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "push",
        help="write/update the model card of a trained folder and upload the folder to the Hugging Face Hub",
        description=(
            "Write or update OUTPUT_DIR/README.md (Hub metadata, method and citations, hyperparameters, training "
            "curves, pass@k from results.json files) and upload the folder with huggingface_hub. Needs a token "
            "(`hf auth login` or HF_TOKEN). A failed push leaves the folder unchanged."
        ),
    )
    p.add_argument("--output-dir", required=True, help="the folder the trainer saved (model or LoRA adapter)")
    p.add_argument("--repo-id", default=None,
                   help="USER/NAME on the Hub (created if missing); required unless --dry-run")
    p.add_argument("--private", action="store_true", help="create the repository private")
    p.add_argument("--results", nargs="+", default=None, metavar="RESULTS_JSON",
                   help="results.json files (or folders) of `exploration-trl eval` for the card "
                        "(default: OUTPUT_DIR/eval*/results.json)")
    p.add_argument("--commit-message", default=None, help="commit message (default: 'Upload <method> model ...')")
    p.add_argument("--revision", default=None, help="branch to push to (default: main)")
    p.add_argument("--method", default=None,
                   help="training method, only needed when OUTPUT_DIR has no exploration-trl card yet")
    p.add_argument("--base-model", default=None, help="base model id, only needed when OUTPUT_DIR has no card yet")
    p.add_argument("--dataset", default=None, help="training dataset, only needed when OUTPUT_DIR has no card yet")
    p.add_argument("--no-card", action="store_true", help="upload the folder as it is, without touching README.md")
    p.add_argument("--dry-run", action="store_true",
                   help="render the card and list the files that would be uploaded; no network, nothing written")
    p.set_defaults(func=run_push_command)
    return p


def register(subparsers) -> None:
    """Add the `push` subcommand to an `argparse` subparsers object."""
    add_push_parser(subparsers)


def run_push_command(args: argparse.Namespace) -> int:
    from .push import HubError, plan_push, push_output_dir

    if args.dry_run:
        plan = plan_push(args.output_dir, args.repo_id, results=args.results, method=args.method,
                         base_model=args.base_model, dataset=args.dataset, write_card=not args.no_card)
        print(plan.describe())
        return 0
    if not args.repo_id:
        raise HubError("cannot push to the Hub: --repo-id is missing; give USER/NAME (or use --dry-run to preview)")
    url = push_output_dir(
        args.output_dir,
        args.repo_id,
        private=args.private,
        results=args.results,
        commit_message=args.commit_message,
        revision=args.revision,
        method=args.method,
        base_model=args.base_model,
        dataset=args.dataset,
        write_card=not args.no_card,
    )
    print(f"pushed {args.output_dir} to https://huggingface.co/{args.repo_id}")
    print(url)
    return 0
