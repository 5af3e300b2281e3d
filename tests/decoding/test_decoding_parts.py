"""Policies, the n-gram lookup, the early-exit view, the output projection and the torch-only
import rule."""

from __future__ import annotations

import ast
import copy
import importlib
import pathlib
import sys
from dataclasses import replace

import pytest
import torch

import decoding
from decoding import (
    Adaptive,
    BlockOutcome,
    CausalLM,
    ConfidenceStop,
    ConstantK,
    Heuristic,
    LookupBranchDrafter,
    PromptLookupDrafter,
    greedy_accept,
    make_policy,
)
from decoding.drafters import draft_block
from decoding.projection import OutputProjection
from decoding.protocols import NO_TOKEN, Draft, DraftRequest
from decoding.verify import best_tokens

DECODING_DIR = pathlib.Path(decoding.__file__).parent


def outcome(k=4, accepted=4, rejections=0, draft=0.01, verify=0.1, width=None) -> BlockOutcome:
    """A one-row step: k drafts, `accepted` of them kept."""
    width = k if width is None else width
    return BlockOutcome(k, width, k, accepted, rejections, draft, verify, includes_prefill=False)


def test_decoding_imports_with_transformers_blocked(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)  # any import of it now fails
    for name in [name for name in sys.modules if name.split(".")[0] == "decoding"]:
        monkeypatch.delitem(sys.modules, name)

    for path in sorted(DECODING_DIR.glob("*.py")):
        module = "decoding" if path.stem == "__init__" else f"decoding.{path.stem}"
        importlib.import_module(module)


def test_no_decoding_module_mentions_transformers_in_an_import():
    for path in DECODING_DIR.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import | ast.ImportFrom):
                names = [alias.name for alias in node.names] + [getattr(node, "module", "")]
                assert not any("transformers" in (name or "") for name in names), path


def test_greedy_accept_keeps_the_matching_prefix_and_the_next_argmax():
    argmax = torch.tensor([[3, 1, 4, 1], [3, 1, 4, 1], [2, 7, 1, 8]])
    logits = torch.nn.functional.one_hot(argmax, 10).float()
    drafts = torch.tensor([[3, 1, 4], [3, 9, 4], [2, 7, NO_TOKEN]])

    verdict = greedy_accept(drafts, logits)

    assert verdict.accepted.tolist() == [3, 1, 2]
    assert verdict.tokens.tolist() == argmax.tolist()


def test_constant_and_confidence_policies():
    constant, confident = ConstantK(5), ConfidenceStop(k=6, threshold=0.3)
    constant.update(outcome(accepted=0, rejections=1))

    assert constant.next_k() == 5 and constant.stop_below == 0
    assert confident.next_k() == 6 and confident.stop_below == 0.3
    with pytest.raises(ValueError, match="threshold"):
        ConfidenceStop(threshold=1.5)
    with pytest.raises(ValueError, match="k"):
        ConstantK(0)


def test_heuristic_grows_by_two_on_full_acceptance_and_shrinks_by_one_otherwise():
    policy = Heuristic(start=4, low=2, high=7)
    ks = []
    for full in [True, True, False, False, False, False]:
        policy.update(outcome(accepted=4 if full else 1, rejections=0 if full else 1))
        ks.append(policy.next_k())

    assert ks == [6, 7, 6, 5, 4, 3]
    policy.update(outcome(accepted=0, rejections=1))
    policy.update(outcome(accepted=0, rejections=1))
    assert policy.next_k() == 2
    with pytest.raises(ValueError, match="must start between 2 and 7 \\(got 9\\)"):
        Heuristic(start=9, low=2, high=7)


def test_a_heuristic_asked_to_start_past_its_ceiling_raises_the_ceiling():
    """`generate --k 32` was refused as "need low <= start <= high (got 1, 32, 16)"."""
    from decoding.lookahead import make_policy

    policy = make_policy("heuristic", 32, 0.4)
    assert policy.next_k() == 32
    policy.update(outcome(accepted=32, rejections=0))
    assert policy.next_k() == 32  # grows no further than it was asked to start
    assert make_policy("heuristic", 4, 0.4).high == 16  # the usual ceiling stands


def test_adaptive_drafts_long_blocks_when_drafts_are_cheap_and_accepted():
    policy = Adaptive(k_max=10)
    for _ in range(40):
        k = policy.next_k()
        policy.update(outcome(k=k, accepted=k, draft=0.001 * k, verify=0.1))

    assert policy.alpha > 0.95
    assert policy.next_k() == 10


def test_adaptive_stops_drafting_when_drafts_do_not_pay_but_keeps_probing():
    rejected, expensive = Adaptive(k_max=10, probe_every=4), Adaptive(k_max=10, probe_every=4)
    for _ in range(30):
        rejected.update(outcome(k=2, accepted=0, rejections=1, draft=0.02, verify=0.1))
        expensive.update(outcome(k=2, accepted=1, rejections=1, draft=0.4, verify=0.1))

    assert 0.45 < expensive.alpha < 0.55  # one success per failure
    assert [rejected.next_k() for _ in range(8)] == [0, 0, 0, 1, 0, 0, 0, 1]
    assert expensive.next_k() == 0


def test_adaptive_probes_twice_as_long_after_a_probe_accepted_whole():
    policy = Adaptive(k_max=10, probe_every=3)
    for _ in range(30):  # drafts rejected at once: plain decoding pays
        policy.update(outcome(k=2, accepted=0, rejections=1, draft=0.02, verify=0.1))
    assert [policy.next_k() for _ in range(3)] == [0, 0, 1]
    policy.update(outcome(k=1, accepted=1, draft=0.02, verify=0.1))  # from now on, all right
    lengths = []
    for _ in range(6):
        k = policy.next_k()
        lengths.append(k)
        policy.update(outcome(k=k, accepted=k, draft=0.02 * k, verify=0.1))
    # A longer probe follows at once (before, plain decoding until the next probe_every-th
    # step), and drafting goes on while the drafts keep being right.
    assert lengths[0] == 2
    assert min(lengths) >= 2
    policy.update(outcome(k=lengths[-1], accepted=0, rejections=1, draft=0.02, verify=0.1))
    assert policy._probe_next == 0  # an ordinary block starts no probe


def test_adaptive_with_flat_verify_cost_is_the_textbook_optimum():
    policy = Adaptive(k_max=12)
    policy.successes, policy.failures = 8.0, 2.0  # alpha = 0.8
    policy.draft, policy.verify = {1: 0.05}, {1: 1.0}  # c = 0.05 at every k

    def textbook(k: int) -> float:
        return (1 - 0.8 ** (k + 1)) / (1 - 0.8) / (k * 0.05 + 1)

    assert policy.next_k() == max(range(1, 13), key=textbook) == 8


def test_adaptive_drafts_less_when_wider_blocks_cost_more_to_verify():
    policy = Adaptive(k_max=12)
    policy.successes, policy.failures = 8.0, 2.0
    policy.draft = {1: 0.05}
    policy.verify = {0: 1.0, **{k: 1.0 + 0.15 * k for k in range(1, 13)}}  # a CPU-bound target

    assert 1 <= policy.next_k() < 8


def test_adaptive_drafts_longer_when_survival_grows_along_the_block():
    """Same pooled alpha, same costs: acceptance that is bursty (a draft that was right so far
    tends to stay right) makes long blocks pay, where the geometric model stops early."""
    geometric, bursty = Adaptive(k_max=12), Adaptive(k_max=12)
    for policy in (geometric, bursty):
        policy.successes, policy.failures = 8.0, 2.0  # alpha = 0.8
        policy.draft = {1: 0.05}
        policy.verify = {0: 1.0, **{k: 1.0 + 0.05 * k for k in range(1, 13)}}
    # Each position seen 100 times: the first draft is often wrong, the later ones rarely.
    bursty.position_reached = [100.0] * 12
    bursty.position_kept = [60.0] + [99.0] * 11

    assert geometric.survival_rates()[5] == pytest.approx(0.8)
    assert bursty.survival_rates()[0] < 0.65 and bursty.survival_rates()[5] > 0.95
    assert bursty.next_k() > geometric.next_k() + 2


def test_adaptive_learns_survival_per_position_from_block_outcomes():
    policy = Adaptive(k_max=4, decay=0.99)
    for _ in range(50):  # one row: drafts 1 and 2 always kept, draft 3 always rejected
        policy.update(
            BlockOutcome(4, 4, 4, 2, 1, 0.01, 0.1, False, reached=(1, 1, 1, 0), kept=(1, 1, 0, 0))
        )

    first, second, third, fourth = policy.survival_rates()
    assert first > 0.9 and second > 0.9
    assert third < 0.2
    assert fourth == pytest.approx(third)  # never reached: its predecessor's rate


def test_adaptive_prices_untried_widths_on_the_line_through_measured_ones():
    policy = Adaptive()
    policy.verify = {2: 1.2}
    assert policy.verify_seconds(9) == 1.2  # one width known: flat
    policy.verify = {2: 1.2, 4: 1.4, 6: 1.6}
    assert policy.verify_seconds(10) == pytest.approx(2.0)
    assert policy.verify_seconds(0) == pytest.approx(1.0)
    policy.verify = {2: 1.5, 4: 1.0}  # noise that slopes down is taken as flat, not as free
    assert policy.verify_seconds(12) == pytest.approx(1.25)
    policy.verify = {1: 0.1, 2: 1.0}
    assert policy.verify_seconds(0) == pytest.approx(0.05)  # never below half the cheapest


def test_adaptive_prices_draft_calls_with_their_fixed_part():
    """A draft call that costs 0.6 + 0.4 k (catching up, re-encoding) makes one-token blocks a
    loss and long ones a gain, where a per-token average would condemn every block."""
    policy = Adaptive(k_max=12)
    policy.successes, policy.failures = 19.0, 1.0  # alpha = 0.95
    policy.verify = {0: 1.0, 1: 1.1, 2: 1.2}
    policy.draft = {1: 1.0, 2: 1.4}

    assert policy.draft_seconds(10) == pytest.approx(4.6)
    assert policy.expected_tokens()[1] / policy.seconds(1) < 1.0  # worse than plain decoding
    assert policy.next_k() >= 8


def test_adaptive_with_a_confidence_stop_leaves_block_ends_to_the_draft():
    policy = Adaptive(k_max=12, confidence_stop=0.4)
    assert policy.stop_below == 0.4 and policy.stop_joint
    for _ in range(20):  # cheap drafts, mostly accepted: drafting pays
        k = policy.next_k()
        policy.update(outcome(k=k, accepted=3, rejections=1, draft=0.01, verify=0.1, width=4))
    assert policy.next_k() == 12  # the confidence stop, not k*, ends the block

    for _ in range(30):  # now every draft is rejected
        policy.update(outcome(k=12, accepted=0, rejections=1, draft=0.6, verify=0.1, width=4))
    assert policy.next_k() == 0
    with pytest.raises(ValueError, match="confidence_stop"):
        Adaptive(confidence_stop=1.0)


def test_adaptive_prices_a_draft_call_by_the_steps_it_took():
    policy = Adaptive(k_max=12, confidence_stop=0.4)
    stopped_early = BlockOutcome(12, 2, 2, 2, 0, 0.03, 0.1, includes_prefill=False, draft_steps=3)
    policy.update(stopped_early)

    assert policy.draft == {3: 0.03}


def test_adaptive_without_a_confidence_stop_never_stops_on_confidence():
    assert Adaptive().stop_below == 0


def test_adaptive_ignores_the_prefill_step_time():
    policy = Adaptive()
    policy.update(BlockOutcome(4, 4, 4, 4, 0, 5.0, 50.0, includes_prefill=True))

    assert policy.verify == {} and policy.draft == {}
    assert policy.alpha > 0.7


def test_adaptive_prices_calls_by_the_rows_they_score():
    """A batch of windows sheds rows as they end: costs measured on 8 rows must not price
    blocks on 1, nor the other way round (one table sloped the wrong way and drafted long
    blocks into full batches)."""
    policy = Adaptive(k_max=8)
    policy.successes, policy.failures = 15.0, 5.0  # alpha = 0.75
    for width in (0, 1, 2, 3):  # one row: verifying is nearly free, drafting pays
        policy.update(replace(outcome(k=width, verify=0.010 + 0.0002 * width), rows=1))
    for width in (0, 1, 2, 3):  # eight rows: every drafted column costs a plain step's share
        policy.update(replace(outcome(k=width, verify=0.040 * (1 + width)), rows=8))
    assert policy.next_k(rows=1) >= 3
    assert policy.next_k(rows=8) == 0
    assert policy.next_k(rows=6) == 0  # never measured: priced as the nearest, 8
    assert policy.next_k(rows=2) >= 3  # nearest: 1


def test_adaptive_takes_a_call_time_spike_as_at_most_twice_the_expected():
    policy = Adaptive()
    for _ in range(5):
        policy.update(outcome(k=2, draft=0.01, verify=0.1))
    policy.update(outcome(k=2, draft=0.01, verify=5.0))  # a new shape's kernels set up
    expected = 0.9 * 0.1 + 0.1 * 0.2  # the spike counted as 0.2
    assert policy.verify[2] == pytest.approx(expected)
    for _ in range(40):  # a lasting rise is still learned
        policy.update(outcome(k=2, draft=0.01, verify=1.0))
    assert policy.verify[2] > 0.9


def test_make_policy_builds_each_policy_by_name_and_names_the_choices():
    assert make_policy("constant", 6, 0.5).next_k() == 6
    assert make_policy("heuristic", 3, 0.5).next_k() == 3
    confidence = make_policy("confidence", 5, 0.25)
    assert isinstance(confidence, ConfidenceStop) and confidence.stop_below == 0.25
    adaptive = make_policy("adaptive", 20, 0.1)
    assert isinstance(adaptive, Adaptive) and (adaptive.k_max, adaptive.stop_below) == (20, 0.1)
    with pytest.raises(ValueError, match="constant, heuristic, confidence, adaptive"):
        make_policy("greedy", 4, 0.0)


class ScriptedConfidenceModel:
    """A draft model whose top next-token probability follows a script, one value per call."""

    vocab = 5

    def __init__(self, tops: list[float]) -> None:
        self.tops = tops
        self.calls = 0

    def score(self, tokens, positions, mask, keep=1):
        top = self.tops[self.calls]
        self.calls += 1
        probs = torch.full((self.vocab,), (1 - top) / (self.vocab - 1))
        probs[2] = top
        return probs.log().expand(tokens.shape[0], keep, self.vocab)


@pytest.mark.parametrize(
    ("stop_joint", "drafted"),
    [(False, 4), (True, 2)],  # tops 0.9, 0.8, 0.9, 0.9: joint 0.9, 0.72, 0.65, 0.58
)
def test_draft_block_stops_on_each_tokens_or_the_joint_confidence(stop_joint, drafted):
    model = ScriptedConfidenceModel([0.9, 0.8, 0.9, 0.9, 0.3, 0.3])
    committed, lengths = torch.tensor([[1, 1, 0, 0]]), torch.tensor([2])

    request = DraftRequest(committed, lengths, k=6, stop_below=0.7, stop_joint=stop_joint)

    draft = draft_block(model, request, cached=torch.zeros(1, dtype=torch.long))

    assert draft.tokens[0, :drafted].tolist() == [2] * drafted
    assert draft.tokens[0, drafted:].tolist() == [NO_TOKEN] * (draft.steps - drafted)
    assert draft.steps == drafted + 1  # the step that found the unsure token


def test_best_tokens_is_the_argmax_with_ties_to_the_first_maximum():
    logits = torch.tensor(
        [[0.0, 2.0, 2.0, 1.0], [-torch.inf, -torch.inf, 3.0, 3.0], [5.0, 5.0, 5.0, 5.0]]
    )
    assert best_tokens(logits).tolist() == logits.argmax(dim=-1).tolist() == [1, 2, 0]
    wide = torch.randint(0, 4, (3, 2, 51865)).float()  # many ties, a vocabulary's width
    assert torch.equal(best_tokens(wide), wide.argmax(dim=-1))


class ScriptedGreedyModel:
    """A draft whose next best token is (call + 1) % vocab; it records which method each call
    used: `score` (logits) or `greedy_chain` (tokens only, decoding.protocols.GreedyTarget,
    recorded as one "greedy" per token)."""

    vocab = 7
    device = torch.device("cpu")

    def __init__(self) -> None:
        self.used: list[str] = []

    def reset(self) -> None: ...

    def rollback(self, lengths) -> None: ...

    def keep_rows(self, rows) -> None: ...

    def _logits(self, rows: int) -> torch.Tensor:
        logits = torch.arange(float(self.vocab)).flip(0).roll(len(self.used) + 1)
        return logits.expand(rows, 1, self.vocab)

    def score(self, tokens, positions, mask, keep=1):
        logits = self._logits(tokens.shape[0])
        self.used.append("score")
        return logits

    def greedy_chain(self, tokens, positions, mask, steps):
        chain = []
        for _ in range(steps):
            chain.append(best_tokens(self._logits(tokens.shape[0])[:, -1]))
            self.used.append("greedy")
        return torch.stack(chain, dim=1)


@pytest.mark.parametrize(
    ("settings", "used"),
    [
        ({}, ["greedy"] * 4),
        ({"branches": 2}, ["score"] + ["greedy"] * 3),  # a tree's root needs the ranks
        ({"stop_below": 0.01}, ["score"] * 4),  # a confidence stop needs the probabilities
    ],
)
def test_draft_block_asks_a_greedy_target_for_tokens_where_no_logits_are_needed(settings, used):
    committed, lengths = torch.tensor([[1, 1, 0, 0]] * 2), torch.tensor([2, 2])
    request = DraftRequest(committed, lengths, k=4, **settings)
    model = ScriptedGreedyModel()
    draft = draft_block(model, request, cached=torch.zeros(2, dtype=torch.long))
    assert model.used == used
    expected = [[1, 2, 3, 4], [1, 2, 3, 4]]
    if settings.get("branches"):
        expected[1][0] = 2  # the second chain starts from the second-best token
    assert draft.tokens.tolist() == expected


def test_prompt_lookup_proposes_what_followed_the_latest_match():
    drafter = PromptLookupDrafter(max_ngram=2, min_ngram=1)
    committed = torch.tensor([[1, 2, 3, 9, 1, 2, 0, 0], [5, 6, 7, 8, 0, 0, 0, 0]])
    lengths = torch.tensor([6, 4])

    draft = drafter.propose(DraftRequest(committed, lengths, k=5))

    # Row 0: "1 2" occurred at the start; "3 9 1 2" followed, and the loop repeats.
    assert draft.tokens[0].tolist() == [3, 9, 1, 2, 3]
    assert draft.tokens[1].tolist() == [NO_TOKEN] * 5
    assert draft.q is None and draft.steps == 0


def test_prompt_lookup_falls_back_to_shorter_ngrams():
    drafter = PromptLookupDrafter(max_ngram=3, min_ngram=1)
    committed = torch.tensor([[4, 8, 6, 5, 8]])

    draft = drafter.propose(DraftRequest(committed, torch.tensor([5]), k=2))

    assert draft.tokens.tolist() == [[6, 5]]


class _FixedDrafter:
    """Proposes the same block every time and records what it was asked to do."""

    def __init__(self, tokens: list[list[int]]) -> None:
        self.tokens = torch.tensor(tokens)
        self.calls: list[str] = []

    def reset(self) -> None:
        self.calls.append("reset")

    def propose(self, request):
        self.calls.append("propose")
        return Draft(tokens=self.tokens.clone(), steps=3)

    def rollback(self, committed, lengths) -> None:
        self.calls.append("rollback")

    def keep_rows(self, rows) -> None:
        self.calls.append("keep_rows")


def test_a_lookup_branch_takes_the_last_chain_where_lookup_adds_a_chain():
    # Three groups of two rows (a tree of two chains per prompt); a group's rows share text.
    texts = [[1, 2, 3, 9, 1, 2], [5, 6, 7, 5, 6, 0], [4, 8, 6, 0, 0, 0]]
    committed = torch.tensor([row for row in texts for _ in range(2)])
    lengths = torch.tensor([6, 6, 5, 5, 3, 3])
    model_chains = [
        [4, 4, 4],
        [7, 7, 7],  # lookup proposes 3 9 1, which the greedy chain does not hold
        [7, 5, 6],
        [1, 1, 1],  # lookup proposes 7 5 6, the greedy chain already: no chain added
        [2, 2, 2],
        [3, 3, 3],  # no n-gram of this row recurs: nothing to add
    ]
    inner = _FixedDrafter(model_chains)
    drafter = LookupBranchDrafter(inner, PromptLookupDrafter(max_ngram=2), branches=2)

    draft = drafter.propose(DraftRequest(committed, lengths, k=3, branches=2))

    assert draft.tokens.tolist() == [[4, 4, 4], [3, 9, 1], *model_chains[2:]]
    assert draft.steps == 3 and draft.q is None  # the model's steps; lookup costs none
    assert drafter.lookup_chains == 1
    drafter.rollback(committed, lengths)
    drafter.keep_rows(torch.tensor([0, 1]))
    drafter.reset()
    assert inner.calls == ["propose", "rollback", "keep_rows", "reset"]
    assert drafter.lookup_chains == 0


def test_a_lookup_branch_needs_a_greedy_tree_of_its_width():
    inner = _FixedDrafter([[1], [1]])
    with pytest.raises(ValueError, match="at least 2 chains"):
        LookupBranchDrafter(inner, PromptLookupDrafter(), branches=1)
    drafter = LookupBranchDrafter(inner, PromptLookupDrafter(), branches=2)
    committed, lengths = torch.tensor([[1, 2], [1, 2]]), torch.tensor([2, 2])
    with pytest.raises(ValueError, match="greedy trees of 2 chains"):
        drafter.propose(DraftRequest(committed, lengths, k=1, branches=1))


def test_early_exit_view_shares_weights_and_leaves_the_model_whole(models):
    target = CausalLM(models.target)
    early = target.early_exit(2)

    assert len(models.target.model.layers) == 4
    assert len(early.view.model.layers) == 2
    assert early.view.lm_head.weight is models.target.lm_head.weight
    assert early.view.model.layers[1] is models.target.model.layers[1]
    with pytest.raises(ValueError, match="exit_layer"):
        target.early_exit(4)


def test_a_model_wrapped_again_reuses_its_output_head(models):
    """The head's transposed copy is made once per weight, not once per drafter."""
    first, second = CausalLM(models.target), CausalLM(models.target)
    assert first.head is not None and second.head is first.head
    copied = copy.deepcopy(models.target)  # the cached head comes along, with the old weight
    assert CausalLM(copied).head.projection.weight.data_ptr() == copied.lm_head.weight.data_ptr()


@pytest.mark.parametrize("rows", [1, 2, 5, 8, 9, 12, 13, 17, 18])
def test_output_projection_matches_the_linear_layer_for_every_row_count(rows):
    generator = torch.Generator().manual_seed(rows)
    weight = torch.randn(1000, 64, generator=generator)
    bias = torch.randn(1000, generator=generator)
    states = torch.randn(1, rows, 64, generator=generator)
    projected = OutputProjection(weight, bias)(states)
    assert projected.shape == (1, rows, 1000)
    torch.testing.assert_close(projected, torch.nn.functional.linear(states, weight, bias))
