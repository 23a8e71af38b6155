"""Two builds of the native module side by side in one process, calls interleaved.

The build machine is a shared VM whose speed drifts by 20% to 30% between runs, more
than most changes are worth. This script loads a second build of ``specaccept._native``
next to the installed one and alternates calls between them (the order swapped every
call and round), so both run under the same conditions; it checks that both give the
same tokens. Run after ``pip install .`` (the installed build, ``A``)::

    PYO3_BUILD_EXTENSION_MODULE=1 cargo build --release --features python --target-dir /tmp/ab
    cp /tmp/ab/release/libspecaccept.so /tmp/b.so        # build B
    python benches/ab.py /tmp/b.so tree-token

Workloads: ``tree-token``, ``tree-traversal``, ``tree-sampled``, ``tree-logits``,
``tree-smollm2`` (and ``tree-smollm2-traversal``), ``chain``, ``rate``, ``smollm2``;
``--drafter 0``, ``1`` or ``2`` keeps one of SmolLM2's drafters; ``--shape 1`` runs the
``tree-smollm2`` workloads on ``bench_tree.SMOLLM2_SHAPES``' second tree (three chains of
four) instead of the 3 x 4 tree. It prints the median
time of each build and ``B / A``. A copy of the installed build as ``B`` shows the noise floor (within about 1.5% of 1 on the build
machine). ``--quick`` runs small shapes, as CI's smoke test does. ``smollm2`` runs
``verify_logits`` at ``B = 1`` on SmolLM2's logits as ``bench_logits.py``'s realistic
table does (needs PyTorch, transformers and the model).
"""

from __future__ import annotations

import argparse
import importlib.machinery
import importlib.util
import statistics
import sys
import time
from collections.abc import Callable

import numpy as np
import specaccept
from bench_tree import TIMED_PARENTS, rejected_rows


def use(build) -> None:
    """Points every module of the package that calls the native module at ``build``."""
    for name, module in list(sys.modules.items()):
        if name.startswith("specaccept") and hasattr(module, "_native"):
            module._native = build


def load(path: str):
    """The native module built at ``path``, loaded under its own name."""
    loader = importlib.machinery.ExtensionFileLoader("specaccept._native", path)
    spec = importlib.util.spec_from_file_location("specaccept._native", path, loader=loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def pick(drafters: tuple, index: int | None) -> tuple:
    """All of SmolLM2's drafters, or the one at ``index``."""
    return drafters if index is None else drafters[index : index + 1]


def workloads(
    name: str, quick: bool, drafter: int | None = None, shape: int = 0
) -> list[Callable[[], object]]:
    """The calls one round makes, each returning what both builds must agree on;
    ``drafter``: only that one of SmolLM2's drafters (``smollm2`` workloads);
    ``shape``: the index of ``tree-smollm2``'s tree in ``bench_tree.SMOLLM2_SHAPES``."""
    rng = np.random.default_rng(0)
    batch, vocab = (4, 4096) if quick else (64, 128256)
    if name in ("tree-token", "tree-traversal"):
        # bench_tree.py's 3 x 4 tree, every candidate rejected.
        parents, nodes = TIMED_PARENTS, len(TIMED_PARENTS)
        p, q, tokens, u, ru = rejected_rows(rng, batch, nodes, vocab)
        method = name.removeprefix("tree-")
        return [
            lambda: (
                specaccept.verify_tree(
                    tokens, parents, p, q, uniforms=u, recovery_uniforms=ru, method=method
                ).output_token_ids
            )
        ]
    if name == "tree-sampled":
        # bench_tree.py's sampled trees (sigma = 1), traversal; each call its own uniforms.
        from bench_tree import sampled_tree

        tokens, target, draft = sampled_tree(rng, batch, vocab, 1.0)
        shape = (batch, len(TIMED_PARENTS))
        calls = []
        for u, ru in [(rng.random(shape), rng.random(batch)) for _ in range(8)]:

            def sampled(u=u, ru=ru):
                return specaccept.verify_tree(
                    tokens,
                    TIMED_PARENTS,
                    target,
                    draft,
                    uniforms=u,
                    recovery_uniforms=ru,
                    method="traversal",
                ).output_token_ids

            calls.append(sampled)
        return calls
    if name in ("tree-logits", "tree-logits-traversal"):
        # bench_tree.py's logits table: the same tree from float32 logits, every
        # child rejected (its draft logit raised by 30), temperature 0.8;
        # "tree-logits" the token rule, "tree-logits-traversal".
        method = "traversal" if name.endswith("traversal") else "token"
        parents, nodes = TIMED_PARENTS, len(TIMED_PARENTS)
        tokens = rng.integers(0, vocab, size=(batch, nodes))
        u, ru = np.full((batch, nodes), np.nextafter(1.0, 0.0)), np.full(batch, 0.5)
        target = rng.normal(size=(batch, nodes, vocab)).astype(np.float32)
        draft = rng.normal(size=(batch, nodes, vocab)).astype(np.float32)
        draft[np.arange(batch)[:, None], np.arange(nodes), tokens] += 30.0
        return [
            lambda: (
                specaccept.verify_tree_logits(
                    tokens,
                    parents,
                    target,
                    draft,
                    temperature=0.8,
                    uniforms=u,
                    recovery_uniforms=ru,
                    method=method,
                ).output_token_ids
            )
        ]
    if name.startswith("tree-smollm2"):
        # bench_tree.py's trees from SmolLM2's logits, every drafter; each call its
        # own uniforms. "tree-smollm2" the token rule, "tree-smollm2-traversal".
        import torch
        from bench_logits import SMOLLM2_DRAFTERS, TEMPERATURE, smollm2_logits
        from bench_tree import SMOLLM2_SHAPES, smollm2_tree

        logits = smollm2_logits(torch)
        if logits is None:
            raise SystemExit("SmolLM2 is not installed")
        method = "traversal" if name.endswith("traversal") else "token"
        parents = SMOLLM2_SHAPES[shape][1]
        calls = []
        for _, sigma in pick(SMOLLM2_DRAFTERS, drafter):
            tokens, target, draft = smollm2_tree(rng, logits, 16, sigma, method, parents)
            for u, ru in [(rng.random(tokens.shape), rng.random(16)) for _ in range(4)]:

                def tree(tokens=tokens, target=target, draft=draft, u=u, ru=ru):
                    return specaccept.verify_tree_logits(
                        tokens,
                        parents,
                        target,
                        draft,
                        temperature=TEMPERATURE,
                        uniforms=u,
                        recovery_uniforms=ru,
                        method=method,
                    ).output_token_ids

                calls.append(tree)
        return calls
    if name == "chain":
        p, q, tokens, u, ru = rejected_rows(rng, batch, 16, vocab)
        ids, q, u = tokens[:, 1:], q[:, 1:], u[:, 1:]
        return [
            lambda: specaccept.verify(ids, p, q, uniforms=u, recovery_uniforms=ru).output_token_ids
        ]
    if name == "rate":
        p = rng.random((batch, 5, vocab), dtype=np.float32)
        q = rng.random((batch, 5, vocab), dtype=np.float32)
        return [lambda: specaccept.acceptance_rate(p, q)]
    if name == "smollm2":
        import torch
        from bench_logits import SMOLLM2_DRAFTERS, TEMPERATURE, smollm2_logits, smollm2_steps

        logits = smollm2_logits(torch)
        if logits is None:
            raise SystemExit("SmolLM2 is not installed")
        filters = dict(temperature=TEMPERATURE, top_k=0, top_p=1.0)
        calls = []
        for _, sigma in pick(SMOLLM2_DRAFTERS, drafter):
            for ids, target, draft, _ in smollm2_steps(logits, sigma, filters, seed=7):
                u, ru = rng.random((1, ids.shape[1])), rng.random(1)

                def call(ids=ids, target=target, draft=draft, u=u, ru=ru):
                    return specaccept.verify_logits(
                        ids, target, draft, **filters, uniforms=u, recovery_uniforms=ru
                    ).output_token_ids

                calls.append(call)
        return calls
    raise SystemExit(f"unknown workload {name!r}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("build", help="path of the other build's libspecaccept.so")
    parser.add_argument(
        "workload",
        choices=[
            "tree-token",
            "tree-traversal",
            "tree-sampled",
            "tree-logits",
            "tree-logits-traversal",
            "tree-smollm2",
            "tree-smollm2-traversal",
            "chain",
            "rate",
            "smollm2",
        ],
    )
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="small shapes (a smoke test)")
    parser.add_argument(
        "--drafter", type=int, choices=range(3), help="smollm2 workloads: only this drafter"
    )
    parser.add_argument(
        "--shape", type=int, choices=range(2), default=0, help="tree-smollm2: the tree's shape"
    )
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    builds = {"A": specaccept._native, "B": load(args.build)}
    for module in builds.values():
        module.set_num_threads(args.threads)
    calls = workloads(args.workload, args.quick, args.drafter, args.shape)
    for build in builds.values():  # warm-up: each build's buffers and workers
        use(build)
        calls[0]()
    times: dict[str, list[float]] = {"A": [], "B": []}
    for r in range(args.rounds):
        for i, call in enumerate(calls):
            order = ("A", "B") if (r + i) % 2 == 0 else ("B", "A")
            results = {}
            for name in order:
                use(builds[name])
                start = time.perf_counter()
                results[name] = call()
                times[name].append(time.perf_counter() - start)
            if not np.array_equal(results["A"], results["B"]):
                raise SystemExit(f"the builds disagree on call {i} of round {r}")
    use(builds["A"])
    a, b = statistics.median(times["A"]), statistics.median(times["B"])
    print(
        f"{args.workload}, {args.threads} thread(s), {args.rounds} rounds: "
        f"A {a * 1e3:.3f} ms, B {b * 1e3:.3f} ms, B / A = {b / a:.3f}"
    )


if __name__ == "__main__":
    main()
