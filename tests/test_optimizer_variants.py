"""MoFO's ablations as options of the same optimizer (docs/methods.md#mofo-filters, #lion, #mofo-lion,
#head-partitions, #moved-share, #hft): every filter and random BCD at fraction 1 are AdamW, MoFO-Lion at fraction 1
is Lion and Lion is its update rule, HFT with nothing frozen is AdamW, per-head partitions of a one-head model are
PyTorch's, hand-computed steps say which entries move, the moved share counts what it says, and the options reach
the trainer, the labels, the CLI and the data (the training sequence length)."""
from __future__ import annotations

import math

import pytest
import torch

from forgetlab.analysis.finetune import ANALYSIS, FinetuneSettings, configs_of
from forgetlab.core.data import EncodedExample
from forgetlab.core.errors import ParameterError
from forgetlab.core.taskvectors import distance, moved_share, weight_change
from forgetlab.train.hft import hft_frozen
from forgetlab.train.lion import Lion, lion_update_
from forgetlab.train.mofo import FILTERS, MoFO, head_partitions, partition_mask
from forgetlab.train.runs import config_label, standard_configs
from forgetlab.train.trainer import make_optimizer, train


def _llama(seed: int = 0, heads: int = 2, kv: int | None = None, hidden: int = 16):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(vocab_size=40, hidden_size=hidden, intermediate_size=32, num_hidden_layers=2,
                                        num_attention_heads=heads, num_key_value_heads=kv or heads,
                                        max_position_embeddings=32))


def _gpt2(seed: int = 0):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    return GPT2LMHeadModel(GPT2Config(vocab_size=40, n_embd=16, n_layer=2, n_head=2, n_positions=32))


def _examples(n: int = 16):
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(n):
        a = int(torch.randint(3, 10, (1,), generator=g))
        out.append(EncodedExample([1, a, 2, a + 10, a + 20], [-100, -100, -100, a + 10, a + 20]))
    return out


def _trained(optimizer: str, steps: int = 4, model=None, **kw):
    model = model if model is not None else _llama(0)
    kw = {"lr": 1e-2, "weight_decay": 0.1, "seed": 3, "batch_size": 4, **kw}
    train(model, _examples(), steps=steps, optimizer=optimizer, **kw)
    return model


def _same(a, b) -> bool:
    return all(torch.equal(pa, pb) for (_, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters()))


# ----------------------------------------------------------------------------------------------- invariants


@pytest.mark.parametrize("filter", FILTERS)
def test_every_filter_and_random_bcd_at_fraction_one_is_adamw(filter):
    adamw = _trained("adamw")
    assert not torch.equal(adamw.model.embed_tokens.weight, _llama(0).model.embed_tokens.weight)   # it moved
    assert _same(_trained("mofo", fraction=1.0, filter=filter), adamw), filter
    assert _same(_trained("mofo", fraction=1.0, filter=filter, partition="head"), adamw), filter


def test_hft_with_nothing_frozen_is_adamw_bit_for_bit():
    """HFT's share 0, and a share too small to freeze a single matrix (the frozen set empty: K = ⌊s·m·L + ½⌋ = 0
    for the 2 layers' 4 attention and 3 MLP matrices at s = 0.05), train exactly as AdamW (and as MoFO)."""
    adamw = _trained("adamw")
    assert _same(_trained("adamw", hft=0.0), adamw)
    assert hft_frozen(_llama(0), 0.05, seed=3) == []
    assert _same(_trained("adamw", hft=0.05), adamw)
    assert _same(_trained("mofo", hft=0.05), _trained("mofo"))
    assert hft_frozen(_llama(0), 0.5, seed=3) and not _same(_trained("adamw", hft=0.5), adamw)   # it can fail


def test_below_fraction_one_the_filters_move_different_entries():
    runs = {f: _trained("mofo", fraction=0.2, filter=f) for f in FILTERS}
    w = {f: m.model.layers[0].mlp.up_proj.weight for f, m in runs.items()}
    for i, a in enumerate(FILTERS):
        for b in FILTERS[i + 1:]:
            assert not torch.equal(w[a], w[b]), (a, b)


def test_lion_is_its_update_rule_written_in_plain_torch():
    lr, b1, b2, wd = 1e-2, 0.9, 0.99, 0.3
    a, ref = _llama(0), _llama(0)
    opt = Lion(a.parameters(), lr=lr, betas=(b1, b2), weight_decay=wd)
    moms = {n: torch.zeros_like(p) for n, p in ref.named_parameters()}
    g = torch.Generator().manual_seed(1)
    for step in range(4):
        ids = torch.randint(0, 40, (3, 10), generator=g)
        opt.zero_grad()
        a(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        ref.zero_grad()
        ref(input_ids=ids, labels=ids).loss.backward()
        with torch.no_grad():                   # Chen et al. 2023, Algorithm 2
            for n, p in ref.named_parameters():
                c = b1 * moms[n] + (1 - b1) * p.grad
                p.sub_(lr * (torch.sign(c) + wd * p))
                moms[n] = b2 * moms[n] + (1 - b2) * p.grad
        for (n, pa), (_, pr) in zip(a.named_parameters(), ref.named_parameters()):
            torch.testing.assert_close(pa, pr, rtol=0, atol=1e-6, msg=f"{n} at step {step}")
            torch.testing.assert_close(opt.state[pa]["exp_avg"], moms[n], rtol=1e-5, atol=1e-8)
    assert (a.model.embed_tokens.weight - _llama(0).model.embed_tokens.weight).abs().max() > 1e-2   # ≥ one lr


def test_lion_one_step_by_hand():
    p = torch.tensor([[1.0, -2.0, 0.5]])
    m = torch.zeros_like(p)
    g = torch.tensor([[0.3, -0.1, 0.0]])
    lion_update_(p, g, m, lr=0.1, betas=(0.9, 0.99), weight_decay=0.5)
    # c = 0.1·g → sign (1, −1, 0); θ ← θ·(1 − 0.05) − 0.1·sign(c); m ← 0.01·g
    torch.testing.assert_close(p, torch.tensor([[0.85, -1.8, 0.475]]))
    torch.testing.assert_close(m, torch.tensor([[0.003, -0.001, 0.0]]))


def test_mofo_lion_at_fraction_one_is_lion():
    lion = _trained("lion", lr=1e-3)
    assert not torch.equal(lion.model.embed_tokens.weight, _llama(0).model.embed_tokens.weight)
    for f in ("momentum", "gradient", "random"):
        assert _same(_trained("mofo-lion", lr=1e-3, fraction=1.0, filter=f), lion), f
    assert not _same(_trained("mofo-lion", lr=1e-3, fraction=0.2), lion)


def test_head_partitions_of_a_one_head_model_are_pytorchs():
    one = _llama(0, heads=1, hidden=8)
    blocks = head_partitions(one)
    q = "model.layers.0.self_attn.q_proj.weight"
    assert blocks[q] == [(0, 0, 8)] and blocks["model.layers.0.self_attn.o_proj.weight"] == [(1, 0, 8)]
    opt = make_optimizer(one, "mofo", lr=1e-2, partition="head")
    assert sum(b is not None for b in opt.param_groups[0]["blocks"]) == 8    # q, k, v, o of 2 layers, cut
    kw = dict(fraction=0.3, filter="momentum")
    tensor = _trained("mofo", model=_llama(0, heads=1, hidden=8), **kw)
    head = _trained("mofo", model=_llama(0, heads=1, hidden=8), partition="head", **kw)
    assert _same(tensor, head)
    two = _trained("mofo", model=_llama(0, heads=2, hidden=8), partition="head", **kw)   # and it matters
    assert not _same(_trained("mofo", model=_llama(0, heads=2, hidden=8), **kw), two)


# ----------------------------------------------------------------------------------------------- partitions


def test_head_partitions_follow_the_anatomy_llama_gqa_and_gpt2():
    gqa = head_partitions(_llama(0, heads=4, kv=2, hidden=16))       # head_dim 4, 2 kv heads
    attn = "model.layers.1.self_attn."
    assert gqa[attn + "q_proj.weight"] == [(0, 0, 4), (0, 4, 8), (0, 8, 12), (0, 12, 16)]
    assert gqa[attn + "k_proj.weight"] == gqa[attn + "v_proj.weight"] == [(0, 0, 4), (0, 4, 8)]
    assert gqa[attn + "o_proj.weight"] == [(1, 0, 4), (1, 4, 8), (1, 8, 12), (1, 12, 16)]
    assert not any("mlp" in n or "embed" in n for n in gqa)
    gpt = head_partitions(_gpt2(0))                                  # head_dim 8; Conv1D (in, out)
    c_attn = gpt["transformer.h.0.attn.c_attn.weight"]
    assert c_attn == [(1, s, s + 8) for s in range(0, 48, 8)]        # q, k, v of each head: 6 blocks
    assert gpt["transformer.h.0.attn.c_proj.weight"] == [(0, 0, 8), (0, 8, 16)]
    assert "transformer.h.0.attn.c_attn.bias" not in gpt


def test_partition_mask_takes_the_top_share_of_each_block_by_hand():
    scores = torch.tensor([[9.0, 8.0], [7.0, 6.0], [1.0, 2.0], [3.0, 4.0]])
    whole = partition_mask(scores, 0.5)
    assert whole.tolist() == [[True, True], [True, True], [False, False], [False, False]]
    rows = partition_mask(scores, 0.5, [(0, 0, 2), (0, 2, 4)])        # the top 2 of each pair of rows
    assert rows.tolist() == [[True, True], [False, False], [False, False], [True, True]]
    cols = partition_mask(scores, 0.25, [(1, 0, 1), (1, 1, 2)])       # the top 1 of each column
    assert cols.tolist() == [[True, True], [False, False], [False, False], [False, False]]


def test_per_head_mofo_moves_the_same_count_in_every_head():
    model = _llama(0, heads=2, hidden=16)
    opt = make_optimizer(model, "mofo", lr=1e-2, fraction=0.1, partition="head")
    ids = torch.randint(0, 40, (2, 10), generator=torch.Generator().manual_seed(2))
    model(input_ids=ids, labels=ids).loss.backward()
    q = model.model.layers[0].self_attn.q_proj.weight
    before = q.detach().clone()
    opt.step()
    moved = q.detach() != before
    k = math.ceil(0.1 * 8 * 16)                                       # a head's block: 8 rows × 16 inputs
    assert opt.state[q]["updated"] == 2 * k
    assert int(moved[:8].sum()) == int(moved[8:].sum()) == k


def test_bad_partitions_and_options_are_refused():
    w = torch.nn.Parameter(torch.zeros(4, 2))
    with pytest.raises(ParameterError, match="cover dimension 0"):
        MoFO([("w", w)], partitions={"w": [(0, 0, 2), (0, 3, 4)]}, unfiltered=set())
    with pytest.raises(ParameterError, match="one dimension"):
        MoFO([("w", w)], partitions={"w": [(0, 0, 2), (1, 0, 2)]}, unfiltered=set())
    with pytest.raises(ParameterError, match="Unknown MoFO filter"):
        MoFO([("w", w)], filter="hessian")
    with pytest.raises(ParameterError, match="Lion does not keep"):
        MoFO([("w", w)], filter="mv", base="lion")
    ex = _examples(4)
    for kw, message in [({"optimizer": "adamw", "filter": "gradient"}, "are MoFO's options"),
                        ({"optimizer": "lion", "partition": "head"}, "are MoFO's options"),
                        ({"optimizer": "mofo-lion", "filter": "gv"}, "Lion does not keep"),
                        ({"optimizer": "mofo", "partition": "layer"}, "Unknown partition"),
                        ({"optimizer": "adam"}, "Unknown optimizer")]:
        with pytest.raises(ParameterError, match=message):
            train(_llama(0), ex, steps=1, **kw)


# ----------------------------------------------------------------------------------------------- filters by hand


def _two_steps(filter: str, base: str = "adam", second: tuple = (0.0, 0.0, 2.0, 1.0)):
    """Four entries, fraction ½ (k = 2): g1 = (4, 3, 0, 0), then g2 = `second`. The entries each step moved."""
    w = torch.nn.Parameter(torch.zeros(1, 4))
    opt = MoFO([("w", w)], lr=0.1, fraction=0.5, unfiltered=set(), filter=filter, base=base)
    moved = []
    for grad in ([4.0, 3.0, 0.0, 0.0], list(second)):
        before = w.detach().clone()
        w.grad = torch.tensor([grad])
        opt.step()
        moved.append(set((w.detach() != before).nonzero()[:, 1].tolist()))
    return moved


def test_which_entries_move_by_hand():
    # MoFO: m2 = 0.9·0.1·g1 + 0.1·g2 = (.36, .27, .2, .1) keeps entries 0 and 1; FLT(g) takes |g2|'s 2 and 3
    assert _two_steps("momentum") == [{0, 1}, {0, 1}]
    assert _two_steps("gradient") == [{0, 1}, {2, 3}]
    # FLT(g/√v): g2/√v̂2 = (0, 0, 1.414, 1.414); FLT(m/√v): m̂2/√v̂2 = (0.670, 0.670, 0.744, 0.744)
    assert _two_steps("gv")[1] == _two_steps("mv")[1] == {2, 3}
    # MoFO-Lion filters by |m_{t−1}|: |g1| at step 1 (m0 = 0), m1 = 0.01·g1 → entries 0, 1 at step 2, although with
    # g2 = (0, 0, 20, 10) the updated m2 = (.0396, .0297, .2, .1) would take 2 and 3
    assert _two_steps("momentum", "lion", (0.0, 0.0, 20.0, 10.0)) == [{0, 1}, {0, 1}]
    assert _two_steps("gradient", "lion", (0.0, 0.0, 20.0, 10.0)) == [{0, 1}, {2, 3}]


def test_random_bcd_draws_a_fresh_seeded_subset_of_k_each_step():
    def masks(seed: int):
        w = torch.nn.Parameter(torch.zeros(10, 10))
        opt = MoFO([("w", w)], lr=0.1, fraction=0.2, unfiltered=set(), filter="random", seed=seed)
        out = []
        for _ in range(3):
            before = w.detach().clone()
            w.grad = torch.ones(10, 10)                     # equal momenta: the filter alone picks
            opt.step()
            out.append(w.detach() != before)
        return out

    a, b, c = masks(0), masks(0), masks(1)
    assert all(int(m.sum()) == 20 for m in a)
    assert all(torch.equal(x, y) for x, y in zip(a, b))                     # seeded
    assert not torch.equal(a[0], a[1]) and not torch.equal(a[0], c[0])      # fresh each step, per seed
    momentum = MoFO([("w", torch.nn.Parameter(torch.zeros(10, 10)))], fraction=0.2, unfiltered=set())
    w = momentum.param_groups[0]["params"][0]
    w.grad = torch.ones(10, 10)
    momentum.step()                                         # ties: the first 20 in storage order, not a draw
    assert not torch.equal((w.detach() != 0), a[0])


# ----------------------------------------------------------------------------------------------- moved share


def test_moved_share_on_a_hand_made_pair():
    theta0 = {"a": torch.zeros(4), "b": torch.ones(2, 2), "only_base": torch.ones(3)}
    theta = {"a": torch.tensor([0.0, 1e-6, 3e-6, -5e-6]), "b": torch.tensor([[1.0, 1.0], [1.0, 1.5]]),
             "only_tuned": torch.ones(5)}
    assert moved_share(theta, theta0) == 3 / 8                 # 3e-6, −5e-6 and 0.5 exceed 2e-6
    assert moved_share(theta, theta0, threshold=4e-6) == 2 / 8
    assert math.isnan(moved_share({"x": torch.ones(2)}, theta0))
    change = weight_change(theta, theta0)
    assert change.moved == 3 / 8 and change.distance == distance(theta, theta0)
    assert change.distance == pytest.approx(0.5 / 2)              # ‖Δb‖/‖b0‖; "a" has ‖θ0‖ = 0: left out


def test_training_records_the_moved_share():
    model, start = _llama(0), _llama(0)
    res = train(model, _examples(), steps=2, optimizer="mofo", fraction=0.1, lr=1e-2, eval_every=1)
    assert [r["moved"] for r in res.history][0] == 0.0
    final = res.history[-1]
    assert final["moved"] == moved_share(dict(model.named_parameters()), dict(start.named_parameters()))
    assert 0.0 < final["moved"] < 0.5                             # MoFO moved a few of the matrices' entries
    assert final["distance"] == pytest.approx(distance(dict(model.named_parameters()),
                                                       dict(start.named_parameters())))
    plain = train(_llama(0), _examples(), steps=2, lr=1e-2, eval_every=1)
    assert plain.history[-1]["moved"] > 0.9                       # AdamW moves nearly every entry
    given = train(_llama(0), _examples(), steps=1, eval_every=1, distance_fn=lambda: 0.25)
    assert given.history[-1] == {"step": 1, "distance": 0.25}    # a number: D alone


# ----------------------------------------------------------------------------------------------- the settings


def test_labels_configs_and_flags_name_the_options():
    assert config_label("mofo", filter="gradient") == "mofo-0.2-flt-g"
    assert config_label("mofo", fraction=0.03, filter="random", partition="head") == "mofo-0.03-random-heads"
    assert config_label("mofo-lion", fraction=0.1, filter="mv") == "mofo-lion-0.1-flt-mv"
    assert config_label("lion", l2=0.5) == "lion+l2-0.5"
    one = configs_of(FinetuneSettings(task="math", optimizer="mofo", filter="gv", partition="head", steps=2))[0]
    assert (one.label, one.filter, one.partition) == ("mofo-0.2-flt-gv-heads", "gv", "head")
    assert one.train_kwargs()["filter"] == "gv" and one.train_kwargs()["partition"] == "head"
    both = configs_of(FinetuneSettings(task="math", compare=True, filter="random", steps=2))
    assert [c.label for c in both][:2] == ["adamw", "mofo-0.2-random"] and both[0].filter == "momentum"
    assert [c.label for c in standard_configs()][1] == "mofo-0.2"
    with pytest.raises(ParameterError, match="are MoFO's options"):
        ANALYSIS.check(FinetuneSettings(task="math", optimizer="adamw", filter="gradient"))
    from forgetlab import cli

    args = cli.build_parser().parse_args(["finetune", "pool.yaml", "--task", "math", "--optimizer", "mofo-lion",
                                          "--filter", "gradient", "--partition", "head", "--max-length", "64"])
    assert (args.optimizer, args.filter, args.partition, args.max_length) == ("mofo-lion", "gradient", "head", 64)
    assert FinetuneSettings().max_length == 256


def test_the_sequence_length_reaches_the_training_data(pool, monkeypatch):
    import forgetlab.train.runs as runs
    from forgetlab.train.examples import training_examples

    task = pool.task_names[0]
    longest = max(len(e.input_ids) for e in training_examples(pool, task))
    assert longest > 6
    assert max(len(e.input_ids) for e in training_examples(pool, task, max_length=6)) == 6
    seen = []

    def spy(*a, **kw):
        seen.append(kw["max_length"])
        return training_examples(*a, **kw)

    monkeypatch.setattr(runs, "training_examples", spy)
    settings = FinetuneSettings(task=task, optimizer="lion", steps=1, batch_size=2, lr=1e-4, warmup=0,
                                max_length=6, eval_every=1, max_general=2, max_task=2, max_train=4, device="cpu")
    result = ANALYSIS.compute(pool, settings)
    assert seen == [6]
    run = result.runs[0]
    assert run.train.settings["max_length"] == 6
    assert run.train.settings["optimizer"] == "lion" and run.train.settings["betas"] == [0.9, 0.99]
    assert 0.0 < run.moved <= 1.0 and "moved" in result.to_frame()
