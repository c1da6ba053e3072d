"""CPU to create one sandboxed workflow instance: the worker's shared sandbox against the replayers' strict one.

```console
$ .venv/bin/python -m bench.sandbox_cost            # 50 instances per workflow and sandbox, 3 interleaved rounds
```

Temporal's sandbox creates an instance for every workflow run a worker starts (and for every run it replays). The
strict sandbox (``TurnKitPlugin(strict_sandbox=True)``) re-imports ``workflows/`` for each; the worker's default
imports it once (``turnkit.plugin.WORKFLOW_MODULES``). This creates instances the way the SDK's own
``SandboxedWorkflowRunner.prepare_workflow`` does (its ``_fake_info``, a private name of temporalio 1.35), in one
process, the two sandboxes interleaved, and prints the median CPU (``time.process_time()``) per instance.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections import defaultdict

import temporalio.converter
from temporalio import workflow
from temporalio.api.common.v1 import Payloads
from temporalio.api.failure.v1 import Failure
from temporalio.worker import WorkflowInstanceDetails
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions
from temporalio.worker.workflow_sandbox._runner import _fake_info  # pyright: ignore[reportPrivateUsage]

from turnkit._workflows.registry import ALL_WORKFLOWS
from turnkit.plugin import PASSTHROUGH_MODULES, WORKFLOW_MODULES


def _details(cls: type) -> WorkflowInstanceDetails:
    converter = temporalio.converter.DataConverter.default
    return WorkflowInstanceDetails(
        payload_converter_factory=converter._new_payload_converter,  # pyright: ignore[reportPrivateUsage]
        failure_converter_class=converter.failure_converter_class,
        interceptor_classes=[],
        defn=workflow._Definition.must_from_class(cls),  # pyright: ignore[reportPrivateUsage]
        info=_fake_info,
        randomness_seed=-1,
        extern_functions={},
        disable_eager_activity_execution=False,
        worker_level_failure_exception_types=[],
        patch_activation_callback=None,
        last_completion_result=Payloads(),
        last_failure=Failure(),
    )


async def main(args: argparse.Namespace) -> None:
    sandboxes = {
        "strict (replayers)": SandboxedWorkflowRunner(
            restrictions=SandboxRestrictions.default.with_passthrough_modules(*PASSTHROUGH_MODULES)
        ),
        "shared (worker)": SandboxedWorkflowRunner(
            restrictions=SandboxRestrictions.default.with_passthrough_modules(*PASSTHROUGH_MODULES, *WORKFLOW_MODULES)
        ),
    }
    cost: dict[tuple[str, str], list[float]] = defaultdict(list)
    for _ in range(args.rounds):
        for label, runner in sandboxes.items():
            for cls in ALL_WORKFLOWS:
                details = _details(cls)
                runner.create_instance(details)  # warm: the first instance also imports what the module needs
                start = time.process_time()
                for _ in range(args.instances):
                    runner.create_instance(details)
                cost[label, cls.__name__].append((time.process_time() - start) / args.instances * 1000)
    print(f"CPU per sandboxed workflow instance (median of {args.rounds} rounds of {args.instances})")
    for (label, name), values in cost.items():
        print(f"  {label:<20} {name:<22} {statistics.median(values):7.2f} ms")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--instances", type=int, default=50, help="instances per workflow, sandbox and round")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds")
    asyncio.run(main(parser.parse_args()))
