"""The runbook's closing check: speculators imports and its configs build.

Builds `VerifierConfig(name_or_path=..., architectures=["Qwen3ForCausalLM"])` and
`GreedyTokenProposalConfig(proposal_type="greedy", speculative_tokens=N, verifier_accept_k=1,
accept_tolerance=0.0)` in the target Python and prints their fields with the installed
speculators version as JSON. Nothing is loaded from the verifier path.
"""

from __future__ import annotations

import argparse
import json
import sys
from importlib import metadata
from typing import Any, Optional


def build_configs(verifier: str, architecture: str, speculative_tokens: int) -> dict[str, Any]:
    from speculators import VerifierConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig

    verifier_config = VerifierConfig(name_or_path=verifier, architectures=[architecture])
    proposal = GreedyTokenProposalConfig(
        proposal_type="greedy",
        speculative_tokens=speculative_tokens,
        verifier_accept_k=1,
        accept_tolerance=0.0,
    )
    return {
        "speculators_version": metadata.version("speculators"),
        "verifier": {
            "name_or_path": verifier_config.name_or_path,
            "architectures": list(verifier_config.architectures),
        },
        "proposal": {
            "proposal_type": proposal.proposal_type,
            "speculative_tokens": proposal.speculative_tokens,
            "verifier_accept_k": proposal.verifier_accept_k,
            "accept_tolerance": proposal.accept_tolerance,
        },
    }


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m specfleet_helpers.checks.speculators_check",
        description="Build speculators' VerifierConfig and GreedyTokenProposalConfig; print JSON.",
    )
    parser.add_argument(
        "--verifier", required=True, help="verifier name or path (recorded, not loaded)"
    )
    parser.add_argument("--architecture", default="Qwen3ForCausalLM")
    parser.add_argument("--speculative-tokens", type=int, default=5)
    args = parser.parse_args(argv)
    print(json.dumps(build_configs(args.verifier, args.architecture, args.speculative_tokens)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
