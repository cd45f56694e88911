"""The process a parity run computes in: ``python -m workbench.integrations.parity_child`` with a ParityJob (JSON)
on stdin; its environment selects the Triton backend before anything imports triton (the interpreter on CPU). The
answer is one line ``@@parity <json>`` on stdout: {"metrics", "patch"} or {"error"}. The promoted operators' code may
write only in the job's ``scratch`` folder (workbench.verify.worker.install_write_guard, as in the replay's child).

The model is built from the job's seed twice over (shipped, then a deep copy patched with apply_workbench_kernels),
both run forward and backward on one batch (labels = the inputs: the causal LM loss), and forward hooks on every
module record its first output tensor, so the first module whose output leaves the bound is named. One more forward
of each (no grad, workbench.integrations.torch_share) gives the share of the compute outside plain projections that
the patched model still runs in torch. On a machine
without a GPU driver the family's functions that transformers bound to fla (``chunk_kda``, ``fused_recurrent_kda``,
resolved when fla is installed) run their torch path (``__wrapped__``): what transformers runs without fla, since
fla's kernels need a driver.
"""

from __future__ import annotations

import collections
import copy
import json
import sys
import traceback
from pathlib import Path
from typing import Any

MARK = "@@parity "


def first_tensor(value: Any):
    """The first tensor of a module's output (a tensor, a tuple, or a ModelOutput); None when there is none."""
    import torch

    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, list | tuple):
        for item in value:
            found = first_tensor(item)
            if found is not None:
                return found
    return None


class Recorder:
    """Forward hooks on every named module: each module's first output tensor (detached), in call order, and the
    router choices (top_k_index) of the family's router modules; with ``last``, each module's output of its latest
    call instead (a generate()'s last step)."""

    def __init__(self, model, router_class: type | None, last: bool = False):
        self.outputs: dict[str, Any] = {}  # in call order (of the latest call with ``last``)
        self.choices: dict[str, Any] = {}
        self.last = last
        self.handles = []
        for path, module in model.named_modules():
            if not path:
                continue
            is_router = router_class is not None and isinstance(module, router_class)
            self.handles.append(module.register_forward_hook(self._hook(path, is_router)))

    def _hook(self, path: str, is_router: bool):
        def hook(module, args, output):
            if is_router:
                self.choices[path] = output[2].detach().clone()
            tensor = first_tensor(output)
            if tensor is not None and (self.last or path not in self.outputs):
                self.outputs.pop(path, None)  # re-inserted last: the dict keeps the call order
                self.outputs[path] = tensor.detach().clone()
        return hook

    @property
    def order(self) -> list[str]:
        """The recorded modules in call order."""
        return list(self.outputs)

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


def first_past(shipped: Recorder, patched: Recorder, bound: float) -> tuple[dict[str, float], str | None]:
    """Each module's output relative difference (the modules both recorded, same shapes) and the first module, in
    the shipped model's call order, past ``bound`` (None when none is)."""
    modules = {path: rel(shipped.outputs[path], patched.outputs[path]) for path in shipped.order
               if path in patched.outputs and shipped.outputs[path].shape == patched.outputs[path].shape}
    return modules, next((p for p in shipped.order if modules.get(p, 0.0) > bound), None)


def torch_paths_without_driver(fam) -> list[str]:
    """Point the family's functions that transformers bound to an installed package's kernels (its closure's
    ``is_new_implementation``) at their torch path when no GPU driver is present; return their names."""
    import torch

    if torch.cuda.is_available():
        return []
    rebound = []
    for name in getattr(fam, "HUB_BOUND", ()):
        shipped = fam.shipped
        fn = getattr(shipped, name)
        bound = dict(zip(fn.__code__.co_freevars, (c.cell_contents for c in fn.__closure__ or ()), strict=True))
        if bound.get("is_new_implementation") and getattr(fn, "__wrapped__", None) is not None:
            setattr(shipped, name, fn.__wrapped__)
            rebound.append(name)
    return rebound


def rel(a, b) -> float:
    """max |a - b| / max |a| in float64 (0 when both are zero)."""
    a, b = a.double(), b.double()
    scale = a.abs().max().item() if a.numel() else 0.0
    diff = (a - b).abs().max().item() if a.numel() else 0.0
    return diff / scale if scale else diff


def logit_metrics(shipped, patched) -> dict[str, float]:
    """KL(shipped || patched) averaged over tokens, cosine of the flattened logits, top-1 agreement, top-5 overlap,
    max relative difference: in float64."""
    import torch

    a, b = shipped.double().reshape(-1, shipped.shape[-1]), patched.double().reshape(-1, patched.shape[-1])
    la, lb = torch.log_softmax(a, -1), torch.log_softmax(b, -1)
    kl = (la.exp() * (la - lb)).sum(-1).mean().item()
    cosine = (torch.dot(a.flatten(), b.flatten()) / (a.norm() * b.norm())).item()
    top1 = (a.argmax(-1) == b.argmax(-1)).double().mean().item()
    k = min(5, a.shape[-1])
    ta, tb = a.topk(k, -1).indices, b.topk(k, -1).indices
    top5 = ((ta[:, :, None] == tb[:, None, :]).any(-1).double().sum(-1) / k).mean().item()
    return {"kl": max(kl, 0.0), "cosine": cosine, "top1": top1, "top5": top5, "logits_rel": rel(a, b)}


def router_match(shipped: dict, patched: dict) -> dict[str, float]:
    """Per router module: the share of tokens whose set of chosen experts is the same."""
    import torch

    found = {}
    for path, ids in shipped.items():
        other = patched.get(path)
        if other is None or other.shape != ids.shape:
            found[path] = 0.0
            continue
        same = (torch.sort(ids, -1).values == torch.sort(other, -1).values).all(-1)
        found[path] = same.double().mean().item()
    return found


DECODE_STEPS = 4


def decode_logits(model, ids, tokens=None):
    """The logits [B, S, V] of S = DECODE_STEPS decode steps after a prefill of ``ids`` [B, P] into a fresh cache,
    and the tokens fed: ``tokens`` (a list of [B]) or, when None, the greedy ones (each step's argmax)."""
    import torch

    with torch.no_grad():
        out = model(input_ids=ids, use_cache=True)
        fed, steps = [], []
        for i in range(DECODE_STEPS):
            token = tokens[i] if tokens is not None else out.logits[:, -1].argmax(-1)
            out = model(input_ids=token[:, None], past_key_values=out.past_key_values, use_cache=True)
            fed.append(token)
            steps.append(out.logits[:, -1])
    return torch.stack(steps, dim=1), fed


def decode_metrics(shipped, patched, ids) -> dict[str, Any]:
    """Generation through the cache the patched prefill wrote (a decode step runs the ops where a family has decode
    forms promoted, the layer's shipped forward elsewhere): the shipped model's greedy tokens fed to both models, so
    the inputs are the same; KL, top-1 agreement and the largest relative difference of the decode logits, as
    ``logit_metrics``."""
    a, tokens = decode_logits(shipped, ids)
    b, _ = decode_logits(patched, ids, tokens)
    found = logit_metrics(a, b)
    return {"decode_kl": found["kl"], "decode_top1": found["top1"], "decode_rel": found["logits_rel"],
            "decode_steps": DECODE_STEPS}


def generate_metrics(shipped, patched, vocab: int, prompt: int, new_tokens: int, seed: int, device: str,
                     bound: float) -> dict[str, Any]:
    """Both models' greedy generate() of ``new_tokens`` tokens, with their caches, on a left-padded batch of two
    prompts (``prompt`` tokens and half as many): the share of sequences whose new tokens are all the shipped model's,
    the first step where any differs (None), the logits compared as ``logit_metrics`` up to that step, the largest
    relative logits difference per step, and the ops the patched generate() ran. At a mismatch, both generate()
    again up to that step (the same tokens in, so far) and the first module whose output there leaves ``bound`` is
    named (None: every module within it, a near-tie the rounding flipped)."""
    import torch

    from workbench.kernels._ops import RUNS

    lengths = [prompt, max(1, prompt // 2)]
    g = torch.Generator().manual_seed(seed + 2)
    ids = torch.zeros(2, prompt, dtype=torch.long)
    mask = torch.zeros(2, prompt, dtype=torch.long)
    for row, length in enumerate(lengths):
        ids[row, prompt - length:] = torch.randint(1, vocab, (length,), generator=g)
        mask[row, prompt - length:] = 1
    def run(model, steps: int):
        with torch.no_grad():
            return model.generate(input_ids=ids.to(device), attention_mask=mask.to(device), max_new_tokens=steps,
                                  do_sample=False, pad_token_id=0, return_dict_in_generate=True, output_logits=True)

    found = {}
    for name, model in (("shipped", shipped), ("patched", patched)):
        before = collections.Counter(RUNS)
        out = run(model, new_tokens)
        found[name] = (out.sequences[:, prompt:].cpu(), torch.stack(out.logits, dim=1).cpu(), RUNS - before)
    (tokens_s, logits_s, _), (tokens_p, logits_p, runs) = found["shipped"], found["patched"]
    same = tokens_s == tokens_p
    first = None if same.all() else int((~same).any(0).nonzero()[0])
    upto = new_tokens if first is None else first + 1  # the inputs are the same up to the first differing token
    compared = logit_metrics(logits_s[:, :upto], logits_p[:, :upto])
    divergence = None
    if first is not None:
        recorders = [Recorder(model, None, last=True) for model in (shipped, patched)]
        for model in (shipped, patched):
            run(model, first + 1)
        modules, module = first_past(*recorders, bound)
        divergence = {"step": first, "module": module, "rel": modules[module] if module else None}
        for recorder in recorders:
            recorder.remove()
    return {"generate_tokens": new_tokens, "generate_prompts": lengths,
            "generate_match": same.all(1).double().mean().item(), "generate_first_mismatch": first,
            "generate_kl": compared["kl"], "generate_rel": compared["logits_rel"],
            "generate_rel_per_step": [rel(logits_s[:, i].double(), logits_p[:, i].double()) for i in range(upto)],
            "generate_divergence": divergence, "generate_op_runs": dict(sorted(runs.items()))}


def float64_grads(shipped, ids) -> dict[str, Any] | str:
    """Every parameter's gradient of the shipped model computed in float64 (a deep copy; experts on transformers'
    eager path, which computes any dtype; its casts to float32, which transformers' norms, softmaxes and chunked
    delta rules make inside, kept in float64 by references.Float64Casts, else the truth would round where the float32
    model rounds): the truth both float32 models are held to where they differ by more than the bound. A string
    (why) where the family's code does not run in float64."""
    from workbench.integrations.references import Float64Casts

    model = copy.deepcopy(shipped).double()
    model.zero_grad(set_to_none=True)
    try:
        if getattr(model.config, "_experts_implementation", None) not in (None, "eager"):
            model.set_experts_implementation("eager")
        with Float64Casts():
            model(input_ids=ids, labels=ids).loss.backward()
    except Exception as exc:  # noqa: BLE001 - the run goes on without the truth, and says why
        return f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
    return {name: p.grad for name, p in model.named_parameters() if p.grad is not None}


def truth_metrics(shipped, patched, truth: dict[str, Any], bound: float) -> dict[str, Any]:
    """For each parameter whose patched gradient is more than ``bound`` from the shipped one: both float32 errors
    against the float64 ``truth`` (norms, relative), and the patched one over its allowance, max(bound, the shipped
    model's own): ``grad_truth_ratio``, the worst, at most 1 for a port as accurate as the published float32 code."""
    mine = dict(patched.named_parameters())
    held = {}
    for name, p in shipped.named_parameters():
        if p.grad is None or mine[name].grad is None or name not in truth:
            continue
        t = truth[name].double()
        norm = t.norm().item() or 1.0
        if (p.grad.double() - mine[name].grad.double()).norm().item() <= bound * p.grad.double().norm().item():
            continue
        held[name] = {"patched": (mine[name].grad.double() - t).norm().item() / norm,
                      "shipped": (p.grad.double() - t).norm().item() / norm}
    ratios = {name: e["patched"] / max(bound, e["shipped"]) for name, e in held.items()}
    worst = max(ratios, key=ratios.get) if ratios else None
    return {"grad_truth": held, "grad_truth_ratio": ratios[worst] if worst else 0.0, "grad_truth_worst": worst}


def grad_metrics(shipped, patched) -> dict[str, Any]:
    """Every parameter's gradient: relative error |g - g'| / |g| (norms), the worst with its name, the median."""
    import statistics

    errors = {}
    mine = dict(patched.named_parameters())
    for name, p in shipped.named_parameters():
        if p.grad is None:
            continue
        q = mine[name].grad
        if q is None:
            errors[name] = float("inf")
            continue
        norm = p.grad.double().norm().item()
        diff = (p.grad.double() - q.double()).norm().item()
        errors[name] = diff / norm if norm else diff
    worst = max(errors, key=errors.get) if errors else None
    return {"grad_rel_worst": errors[worst] if worst else 0.0, "grad_rel_median":
            statistics.median(errors.values()) if errors else 0.0, "grad_worst_param": worst,
            "grad_params": len(errors)}


def drawn_hash_tables(model, seed: int) -> int:
    """Token -> expert hash tables (DeepSeek-V4's hash routers, ``tid2eid`` [vocab, k] beside ``num_experts``) drawn
    as k distinct experts per token, in place. At init they are zeros: every token on expert 0 k times, whose
    renormalized weights are constants, so the gate's gradient there is rounding noise that no parity can hold (a
    trained table never repeats an expert). Returns the tables drawn."""
    import torch

    g = torch.Generator().manual_seed(seed)
    drawn = 0
    for module in model.modules():
        table = getattr(module, "tid2eid", None)
        if isinstance(table, torch.Tensor) and table.dim() == 2 and hasattr(module, "num_experts"):
            picks = torch.rand(table.shape[0], module.num_experts, generator=g).argsort(-1)[:, :table.shape[1]]
            with torch.no_grad():
                table.copy_(picks.to(table))
            drawn += 1
    return drawn


def with_lora(model, rank: int, targets: tuple[str, ...], seed: int):
    """The model wrapped by PEFT's LoRA (rank, alpha 2 * rank, no dropout) on ``targets``, initialised from
    ``seed`` (so the shipped and the patched copy start with the same adapters)."""
    import peft
    import torch

    torch.manual_seed(seed + 2)
    return peft.get_peft_model(model, peft.LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.0,
                                                      target_modules=list(targets)))


def fine_tune(model, steps: int, seed: int, shape, vocab: int, device: str) -> list[float]:
    """``steps`` AdamW steps (lr 1e-2) on fresh batches of ``shape`` from ``seed``: the loss of each."""
    import torch

    g = torch.Generator().manual_seed(seed + 3)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-2)
    losses = []
    for _ in range(steps):
        ids = torch.randint(0, vocab, tuple(shape), generator=g).to(device)
        optimizer.zero_grad(set_to_none=True)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def run(job: dict) -> dict:
    import torch

    import workbench.kernels as wk
    from workbench.integrations.parity import THRESHOLDS
    from workbench.integrations.torch_share import torch_share
    from workbench.integrations.transformers import apply_workbench_kernels, config_class, family
    from workbench.kernels._ops import RUNS
    from workbench.operators import newest_promoted
    from workbench.verify.worker import install_write_guard

    torch.set_num_threads(1)
    wk.set_operators_dir(job["operators_dir"])
    operators = [m["path"] for m in newest_promoted(Path(job["operators_dir"])).values()]
    install_write_guard(operators, [job["scratch"]], "the parity sandbox")  # they write nowhere else
    fam = family(job["model_type"])
    rebound = torch_paths_without_driver(fam)
    dtype = getattr(torch, job["dtype"])
    device = "cuda" if torch.cuda.is_available() else "cpu"
    config = config_class(job["model_type"])(**job["config"])
    notes: list[str] = []
    torch.manual_seed(job["seed"])
    model_cls = getattr(fam.shipped, job["model_class"])
    shipped = model_cls(config).to(device=device, dtype=dtype)
    if drawn_hash_tables(shipped, job["seed"] + 4):
        notes.append("the token-hash routing tables (tid2eid) drawn: distinct experts per token (zeros at init)")
    patched = copy.deepcopy(shipped)
    if job["lora"]:
        shipped, patched = (with_lora(m, job["lora"], fam.LORA_TARGETS, job["seed"]) for m in (shipped, patched))
    report = apply_workbench_kernels(patched, job["blocks"])
    report.notes.extend(notes)
    if rebound:
        report.notes.append(f"no GPU driver: {', '.join(rebound)} ran their torch path (fla's kernels need one) "
                            "in the shipped model")
    g = torch.Generator().manual_seed(job["seed"] + 1)
    ids = torch.randint(0, config.vocab_size, (job["batch"], job["tokens"]), generator=g).to(device)
    router = fam.router_classes(config) if hasattr(fam, "router_classes") else getattr(fam, "ROUTER", None)
    outputs = {}
    for name, model in (("shipped", shipped), ("patched", patched)):
        recorder = Recorder(model, router)
        before = collections.Counter(RUNS)
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        recorder.remove()
        outputs[name] = (out, recorder, RUNS - before)
    (out_s, rec_s, _), (out_p, rec_p, runs) = outputs["shipped"], outputs["patched"]
    metrics: dict[str, Any] = logit_metrics(out_s.logits.detach(), out_p.logits.detach())
    metrics["loss_shipped"], metrics["loss_patched"] = out_s.loss.item(), out_p.loss.item()
    metrics["loss_rel"] = abs(metrics["loss_patched"] - metrics["loss_shipped"]) / abs(metrics["loss_shipped"])
    routers = router_match(rec_s.choices, rec_p.choices)
    if routers:
        metrics["router_match_per_layer"] = routers
        metrics["router_match"] = min(routers.values())
    metrics.update(grad_metrics(shipped, patched))
    grad_bound = THRESHOLDS[job["dtype"]]["grad_rel_max"]
    if metrics["grad_rel_worst"] > grad_bound:  # is the shipped float32 itself that far from the truth there?
        truth = float64_grads(shipped, ids)
        if isinstance(truth, str):
            report.notes.append(f"the float64 gradients could not be computed ({truth}): the gradients are held to "
                                "the shipped float32 ones alone")
        else:
            metrics.update(truth_metrics(shipped, patched, truth, grad_bound))
    before = collections.Counter(RUNS)
    metrics.update(decode_metrics(shipped, patched, ids))
    decode_runs = RUNS - before  # the shipped model runs no op: the patched model's prefill and decode steps'
    metrics["op_runs"] = dict(sorted(runs.items()))
    metrics["decode_op_runs"] = dict(sorted(decode_runs.items()))
    bound = THRESHOLDS[job["dtype"]]["module_rel_max"]
    if job["generate"]:
        metrics.update(generate_metrics(shipped, patched, config.vocab_size, job["tokens"], job["generate"],
                                        job["seed"], device, bound))
    metrics["idle_blocks"] = sorted(set(report.blocks) - set(runs) - set(decode_runs)
                                    - set(metrics.get("generate_op_runs", ())))
    metrics["torch_share"] = torch_share(shipped, patched, ids)
    modules, first = first_past(rec_s, rec_p, bound)
    metrics["first_divergence"] = {"module": first, "rel": modules[first]} if first else None
    worst = max(modules, key=modules.get) if modules else None
    metrics["worst_module"] = {"module": worst, "rel": modules[worst]} if worst else None
    if job["lora"]:
        curves = {name: fine_tune(model, job["steps"], job["seed"], ids.shape, config.vocab_size, device)
                  for name, model in (("shipped", shipped), ("patched", patched))}
        metrics["lora"] = {"rank": job["lora"], "steps": job["steps"], "curves": curves}
        metrics["curve_rel"] = max(abs(p - s) / abs(s) for s, p in zip(curves["shipped"], curves["patched"],
                                                                        strict=True))
    return {"metrics": metrics, "patch": report.as_dict()}


def reply(mark: str, compute) -> None:
    """Write ``compute()``'s answer as one line ``<mark><json>`` on stdout, or {"error": ...} with the exception in
    one line and its last frame (the parent reports it as the run's error)."""
    try:
        answer = compute()
    except Exception as exc:
        last = traceback.extract_tb(exc.__traceback__)[-1]
        answer = {"error": f"{type(exc).__name__}: {' '.join(str(exc).split())} "
                           f"({last.filename.rsplit('/', 1)[-1]}:{last.lineno})"}
    sys.stdout.write(mark + json.dumps(answer) + "\n")
    sys.stdout.flush()


def main() -> None:
    job = json.loads(sys.stdin.read())
    reply(MARK, lambda: run(job))


if __name__ == "__main__":
    main()
