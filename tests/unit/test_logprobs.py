"""Log probabilities: the model's own distribution, each token's alternatives its own whatever
the batch or the reader's pace, and equal to a direct forward pass of the model."""
import asyncio

import pytest
import torch

from contract import SamplingParams, ValidationError
from tests.unit.test_int4 import four_bit_llama  # noqa: F401 - the fixture

PROMPT = "the quick brown fox"


async def run(engine, params: SamplingParams, delay: float = 0.0, prompt: str = PROMPT):
    outs = []
    async for out in engine.generate(prompt, params):
        outs.append(out)
        if delay:
            await asyncio.sleep(delay)
    return outs


def flat(outs) -> tuple:
    return ([t for o in outs for t in o.token_ids], [lp for o in outs for lp in o.logprobs],
            [a for o in outs for a in o.alternatives], [s for o in outs for s in o.token_strs])


@pytest.mark.parametrize("sample", [False, True], ids=["greedy", "sampled"])
async def test_alternatives_equal_a_direct_forward_pass(any_model, make_engine, sample):
    engine = make_engine(any_model, device="cpu")  # fp32 both sides, to 1e-4
    params = SamplingParams(max_tokens=12, top_logprobs=5, logprobs=True, do_sample=sample, seed=3, temperature=0.7,
                            top_k=20, repetition_penalty=1.3, ignore_eos=True)
    ids, logprobs, alternatives, strs = flat(await run(engine, params))
    model, tok = engine.core.loaded.model, engine.tokenizer
    prompt = tok(PROMPT)["input_ids"]
    with torch.no_grad():
        full = torch.log_softmax(model(torch.tensor([prompt + ids])).logits[0].float(), -1)
    for k, token in enumerate(ids):
        row = full[len(prompt) - 1 + k]
        assert logprobs[k] == pytest.approx(float(row[token]), abs=1e-4)  # raw: before penalties and warpers
        values, top = row.topk(5)
        assert [i for i, _, _ in alternatives[k]] == top.tolist()
        assert [lp for _, _, lp in alternatives[k]] == pytest.approx(values.tolist(), abs=1e-4)
        assert strs[k] == tok.decode([token]) and alternatives[k][0][1] == tok.decode([top[0].item()])


@pytest.mark.parametrize("weights", ["int4", "fp32"])
async def test_batched_and_slow_readers_get_each_tokens_own_numbers(four_bit_llama, gpt2_model, make_engine,  # noqa: F811
                                                                    weights):
    """On int4 weights (the C kernels, as the default model runs) bit for bit; on the fp32
    fallback the same tokens, and numbers within float rounding (batched matmuls round differently)."""
    engine = make_engine(four_bit_llama if weights == "int4" else gpt2_model, device="cpu")
    requests = [SamplingParams(max_tokens=20, top_logprobs=k, logprobs=True, do_sample=k % 2 == 1, seed=k,
                               ignore_eos=True) for k in range(1, 7)]
    requests += [SamplingParams(max_tokens=20, regex="[a-z ]{5,30}", top_logprobs=3)]
    alone = [flat(await run(engine, p)) for p in requests]
    together = [flat(t) for t in await asyncio.gather(*(run(engine, p) for p in requests))]
    if weights == "int4":
        assert engine.core.loaded.info.dtype == "int4" and together == alone
    else:
        assert [t[0] for t in together] == [a[0] for a in alone]
        assert [lp for t in together for lp in t[1]] == pytest.approx([lp for a in alone for lp in a[1]], abs=1e-5)
    slow = await run(engine, requests[0], delay=0.03)
    assert any(len(o.token_ids) > 1 for o in slow) and flat(slow) == alone[0]
    assert all(len(o.alternatives) == len(o.token_ids) for o in slow)


async def test_a_constraint_leaves_no_forbidden_alternative(gpt2_model, make_engine):
    engine = make_engine(gpt2_model)
    _, _, alternatives, _ = flat(await run(engine, SamplingParams(max_tokens=6, choice=["ab", "cd"], top_logprobs=20)))
    assert all(lp > float("-inf") for alts in alternatives for _, _, lp in alts)
    assert len(alternatives[0]) < 20  # only what the choice allows


async def test_top_logprobs_is_bounded(gpt2_model, make_engine):
    engine = make_engine(gpt2_model)
    with pytest.raises(ValidationError) as err:
        await engine.open(PROMPT, SamplingParams(top_logprobs=21))
    assert err.value.field == "top_logprobs"


def test_greedy_rows_in_c_pick_torchs_token_and_the_log_softmax():
    """greedy.c: torch.argmax's token (the first of equal maxima), its log-softmax within 1e-5,
    each row the same alone as in a batch, and PyTorch's ops for what it leaves to them."""
    from engine.kernels import native
    from engine.policies.sampling import greedy_choices
    torch.manual_seed(0)
    logits = torch.randn(16, 49_157) * 5  # not a multiple of the vectors: a padded tail
    logits[3, 100] = logits[3, 5000] = logits[3].max() + 1  # a tie: the first wins
    logits[4, :] = float("-inf")  # a constraint that allows one token
    logits[4, 49_156] = 0.5
    chosen = native.greedy(logits)
    if chosen is None:
        pytest.skip("greedy.c does not run here (no compiler, or no AVX2 + FMA)")
    tokens, logprobs = chosen
    assert tokens == torch.argmax(logits, dim=-1).tolist() and tokens[3] == 100 and tokens[4] == 49_156
    exact = torch.log_softmax(logits.double(), dim=-1)[torch.arange(16), torch.tensor(tokens)]
    assert torch.allclose(torch.tensor(logprobs, dtype=torch.float64), exact, rtol=0, atol=1e-5)
    assert [native.greedy(logits[i:i + 1]) for i in range(16)] == [([t], [lp]) for t, lp in zip(tokens, logprobs, strict=True)]
    logits[7, 9] = float("nan")
    assert native.greedy(logits) is None
    assert greedy_choices(logits)[7].token_id == 9  # torch.argmax: a NaN is the largest


@pytest.mark.parametrize("vocab", [1, 7, 8, 9, 61, 4_099])
def test_greedy_rows_in_c_pick_the_first_of_many_equal_maxima(vocab):
    """Ties everywhere (small integers), across the vectors' lanes and their tail, and -0.0 beside
    0.0 (equal, so the first wins): torch.argmax's pick in every row."""
    from engine.kernels import native
    g = torch.Generator().manual_seed(vocab)
    logits = torch.randint(-3, 4, (12, vocab), generator=g).float()
    logits[1, ::2] = float("-inf") if vocab > 1 else 0.0  # (a row of -inf alone is left to PyTorch)
    logits[2] = -0.0
    logits[2, vocab // 2:] = 0.0
    logits[3] = -5.0
    logits[3, -1] = 2.0  # the largest in the tail alone
    chosen = native.greedy(logits)
    if chosen is None:
        pytest.skip("greedy.c does not run here (no compiler)")
    assert chosen[0] == torch.argmax(logits, dim=-1).tolist()
