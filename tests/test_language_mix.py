"""Language mixing (issue 45 item 3): single words of another script scattered through a prose
answer asked in one language are ``language_mix``; technical prose naming identifiers, code,
units, URLs, quoted words and glosses is not. Samples written after DeepSeek answers of the known
failure (Chinese or Russian words inside English sentences) and after ordinary technical prose."""

from __future__ import annotations

import pytest

from dsv4ctl.check import classify as C

MIXED = [
    # (answer, the scattered words the reason names first)
    ("The scheduler keeps 请求 in the waiting queue until the KV cache has 足够 free pages, then it admits "
     "them one batch at a time.", "keeps 请求 in"),
    ("The function returns the result также when the input is empty, and the caller должен check it before "
     "using the value.", "result также when"),
    ("You can restart the server, そして the cache will be rebuilt from the host tier 自動的に on the next "
     "request that needs it.", "server, そして the"),
    ("The router sends the request to the decode server 그리고 waits for the 결과 before it streams the answer "
     "back to the client.", "server 그리고 waits"),
    ("Set the timeout to thirty seconds 然后 restart it; the сервер will pick up the new value after the "
     "next health check passes.", "seconds 然后 restart"),
    ("This approach is more 高效 because it avoids the extra copy of the pages, and it is also 更 robust when "
     "the host memory is under pressure.", "more 高效 because"),
    ("First, drain the node from the router. Then stop the decode server and wait until its queue is empty.\n\n"
     "After that the 缓存 is cleared and the new release can start; the warm-up takes a few minutes, and the "
     "first requests are slower because the prefix cache is 冷的 and has to be filled again.",
     "the 缓存 is"),
    ("In short, the patch fixes the race by holding the lock while the pages are copied, so the 数据 stays "
     "consistent and no reader sees a half-written 页面 anymore.", "the 数据 stays"),
    ("Мы перезапускаем сервер, и кэш заполняется снова; 然后 запросы идут быстрее, а задержка 明显 падает "
     "после прогрева.", "снова; 然后 запросы"),
    ("The overall throughput improved by about twenty percent, which is 非常 good for a change this small, "
     "and latency stayed 稳定 across every level we measured.", "is 非常 good"),
    ("Increase the page size only if the model allows it: larger pages mean fewer 分配 calls but more 浪费 "
     "at the end of each sequence.", "fewer 分配 calls"),
]

CLEAN = [
    "Set `max_running_requests` to 64 and restart; the pool then holds 1.2 GiB per rank, and a decode step "
    "takes about 300 µs at that batch size.",
    "The resistor is 4.7 kΩ and the time constant τ = RC is about 2 ms, so Δt should stay below 0.1 s for the "
    "filter to settle; λ and σ are the usual symbols.",
    "See https://zh.wikipedia.org/wiki/负载均衡 and https://ru.wikipedia.org/wiki/Балансировка_нагрузки for "
    "background on load balancing before you change the router policy.",
    "The file docs/用户指南.md and the key 配置.超时 hold the Chinese guide and its timeout; the English guide "
    "is in docs/guide.md and reads the same keys.",
    "The greeting is \"你好\" in Chinese and «привет» in Russian, and the model should answer with the greeting "
    "of the language the user wrote in.",
    "Run this first:\n\n```python\n数据 = load()\nprint('结果', 数据)\n```\n\nThen check that the output names "
    "every shard and that the total size matches the index.",
    "Beijing (北京) and Moscow (Москва) host the two clusters, and each region runs its own router in front of "
    "the prefill and decode servers.",
    "The λ parameter and the σ of the noise model are both 0.5, α = 0.05 is the significance level, and the "
    "test uses π only in the normal density.",
    "The loss is the cross entropy of the softmax over the logits; the gradient flows back through the router "
    "and the experts, and the auxiliary loss keeps the load balanced.",
    "## 部署指南\nThe deployment guide covers the hosts, the serve configs and the router; read it before the "
    "first deploy and keep it next to the runbooks.",
    "| Language | Greeting |\n|---|---|\n| Chinese | 你好 |\n| Russian | Привет |\n| Greek | Γειά |\n\nThe table lists "
    "the greetings the smoke test expects in each language.",
    "The speed limit there is 60 км/ч, the variable 数据_id holds the row id, and user@例子.com is the address "
    "the test mails; none of these are prose.",
    "Use the `--lang zh` option: the answer 'Hello' then becomes 你好.",
    "The 'Ωmega' board and the ΔT sensor both report in kelvin; the firmware logs them every second and the "
    "dashboard draws one line per sensor.",
    "把 `kv_cache` 设置为 torch.cuda 的显存，然后用 GPU 运行 SGLang 服务器，这样 decode 的延迟会更低，"
    "而且 prefill 不会被阻塞。",
    "Сервер использует SGLang и CUDA; параметр max_running_requests задаёт число запросов, а router "
    "распределяет их между узлами.",
    "Call `open_file('读取.txt')` and then `grep -n 错误 log.txt` to find the error lines; the tool returns "
    "each match with its line number.",
    "The Japanese term is written in katakana (キャッシュ), and the Korean one (캐시) is a loanword too; both "
    "mean cache.",
]


@pytest.mark.parametrize("text,first", MIXED)
def test_scattered_words_of_another_script_are_language_mix(text, first):
    v = C.classify(C.TurnResult(content=text, finish_reason="stop"), requires_tool=False, tools={},
                   expected_script=C.find_language_mix(text).base if C.find_language_mix(text) else "Latin")
    assert v.cls == C.LANGUAGE_MIX, (v.cls, v.reason, text)
    assert repr(first) in v.reason


def test_english_prompt_mixed_answers_are_flagged_with_latin_expected():
    for text, _ in MIXED:
        if text[0].isascii():
            v = C.classify(C.TurnResult(content=text, finish_reason="stop"), requires_tool=False, tools={},
                           expected_script="Latin")
            assert v.cls == C.LANGUAGE_MIX, text


@pytest.mark.parametrize("text", CLEAN)
def test_technical_prose_naming_identifiers_code_units_and_urls_is_clean(text):
    expected = "Latin" if text[:2].isascii() and not text.startswith("##") else None
    for exp in (expected, None):
        v = C.classify(C.TurnResult(content=text, finish_reason="stop"), requires_tool=False, tools={},
                       expected_script=exp)
        assert v.cls == C.OK, (v.cls, v.reason, text)


def test_one_stray_word_a_switch_and_a_drift_are_not_mixing():
    """One word is no scattering (a quoted-less gloss or a name); a long run is a switch, and an
    answer mostly in another script a drift (precedence: drift, switch, mix)."""
    one = "The scheduler keeps every request in the waiting queue until the 缓存 has enough free pages for it."
    assert C.find_language_mix(one) is None
    switch = ("The scheduler keeps every request in the waiting queue until the cache has enough free pages. "
              "然后调度器把请求放回队列，缓存页面在下一批次中被重新加载，这样延迟会降低很多。")
    v = C.classify(C.TurnResult(content=switch, finish_reason="stop"), requires_tool=False, tools={},
                   expected_script="Latin")
    assert v.flags == (C.LANGUAGE_SWITCH,)
    drift = "负载均衡器把请求分给两台推理服务器，每台服务器的队列都不会太长，然后 cache 会更快。"
    v = C.classify(C.TurnResult(content=drift, finish_reason="stop"), requires_tool=False, tools={},
                   expected_script="Latin")
    assert v.flags == (C.LANGUAGE_DRIFT,)


def test_mix_scan_is_linear_on_a_long_hostile_answer():
    import time
    text = ("word 字 " * 60_000) + "end"
    t = time.perf_counter()
    m = C.find_language_mix(text, "Latin")
    assert m is not None and m.words > 1000 and time.perf_counter() - t < 2.0
