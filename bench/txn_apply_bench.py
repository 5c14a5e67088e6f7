"""`python -m bench.txn_apply_bench`: what a transaction's metadata commands cost to apply,
against how many transactional ids the metadata state remembers.

Every replica of the metadata group applies each command of every transaction: three
`AddPartitionsToTxn` (one per partition), `EndTxnBumpEpoch`, `CompleteTxn`, as encoded
bytes through `MetadataMachine.apply` (decode, checks, the domain's apply), after
`InitProducerFenceable` of `--ids` transactional ids (each count of the list in turn; the
state keeps up to `transactional_ids_max`, 100,000). Figures: CPU µs per transaction
(`time.process_time`, the median of `--runs` repeats of `--transactions` transactions over
the ids) at each count, and each count's ratio to the first (the baseline, same run): 1.0
means the cost does not grow with the ids remembered. Single process, one core.
"""

from __future__ import annotations

import argparse
import statistics
import time

from bench import main_of
from dmq.metadata.machine import (
    AddPartitionsToTxn,
    Applied,
    CompleteTxn,
    CreateTopic,
    EndTxnBumpEpoch,
    MetadataMachine,
    RegisterBroker,
    encode_command,
)
from dmq.metadata.producers import InitProducerFenceable

PARTITIONS = 3
IDS_DEFAULT = "100,10000,100000"


def _machine(ids: int) -> tuple[MetadataMachine, list[tuple[str, int, int]]]:
    """A machine with a 3-partition topic and `ids` transactional ids: (id, producer id,
    epoch) of each."""
    machine = MetadataMachine()
    for b in range(3):
        machine.apply(encode_command(RegisterBroker(f"n{b}", f"h{b}", f"r{b}", 1)))
    machine.apply(encode_command(CreateTopic("t", PARTITIONS, 3, (), 2)))
    producers = []
    for k in range(ids):
        result = machine.apply(encode_command(InitProducerFenceable(f"tid-{k}", 3)))
        assert isinstance(result, Applied) and result.producer is not None, result
        producers.append((f"tid-{k}", *result.producer))
    return machine, producers


def _cost_us(
    machine: MetadataMachine, producers: list[tuple[str, int, int]], transactions: int
) -> float:
    """CPU µs per transaction: its five commands, encoded beforehand, applied. Each
    transaction bumps its producer's epoch, which `producers` then holds."""
    now = 10
    commands: list[bytes] = []
    for i in range(transactions):
        k = (i * 7919) % len(producers)  # 7919 is prime to every count used: spread
        tid, pid, epoch = producers[k]
        now += 1
        commands += [
            encode_command(AddPartitionsToTxn(tid, pid, epoch, (f"t:{p}",), 60_000, now))
            for p in range(PARTITIONS)
        ]
        commands.append(encode_command(EndTxnBumpEpoch(tid, pid, epoch, 1, now)))
        commands.append(encode_command(CompleteTxn(tid, epoch, "prepare_commit", now)))
        producers[k] = (tid, pid, epoch + 1)
    start = time.process_time()
    results = [machine.apply(command) for command in commands]
    spent = time.process_time() - start
    refused = [r for r in results if not isinstance(r, Applied)]
    if refused:  # a measure of refusals would be no measure
        raise RuntimeError(f"{len(refused)} commands refused, the first: {refused[0]}")
    return spent * 1e6 / transactions


def measure(args: argparse.Namespace, counts: list[int]) -> dict[str, float]:
    figures: dict[str, float] = {}
    for ids in counts:
        machine, producers = _machine(ids)
        runs = [_cost_us(machine, producers, args.transactions) for _ in range(args.runs)]
        figures[f"ids_{ids}_us_per_transaction"] = statistics.median(runs)
    base = figures[f"ids_{counts[0]}_us_per_transaction"]
    for ids in counts[1:]:
        figures[f"ids_{ids}_ratio"] = figures[f"ids_{ids}_us_per_transaction"] / base
    return figures


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--ids", default=IDS_DEFAULT, help=f"transactional ids remembered ({IDS_DEFAULT})"
    )
    parser.add_argument("--transactions", type=int, default=100, help="per repeat (100)")
    parser.add_argument("--runs", type=int, default=5, help="repeats; medians (5)")
    parser.add_argument("--quick", action="store_true", help="one small run (CI)")


def run(args: argparse.Namespace) -> dict[str, float]:
    if args.quick:
        args.ids, args.transactions, args.runs = "10,1000", 10, 1
    counts = [int(c) for c in args.ids.split(",")]
    print(f"txn_apply_bench: MetadataMachine.apply of a transaction's 5 commands (3 adds, "
          f"the decision, the complete), CPU us per transaction, {args.transactions} "
          f"transactions per repeat, {args.runs} repeats, medians; one process")  # fmt: skip
    r = measure(args, counts)
    for ids in counts:
        ratio = r.get(f"ids_{ids}_ratio")
        print(f"{ids} ids: {r[f'ids_{ids}_us_per_transaction']:.0f} us per transaction"
              + (f" ({ratio:.2f}x the {counts[0]}-id state)" if ratio else " (baseline)"))  # fmt: skip
    return r


main = main_of(__doc__, add_arguments, run)


if __name__ == "__main__":
    raise SystemExit(main())
