"""Recorded outputs of the tool-call formats added beside the first four (tests/
test_tool_parsers.CASES takes them in), written from each model's documented chat format:
(text, content, [(name, arguments)]) per parser."""

from __future__ import annotations

FORMAT_CASES = {
    # Qwen3-Coder's chat template: one <tool_call> block per call, parameters on lines of
    # their own; without the request's tools every value is a string.
    "qwen3_coder": [
        ("Paris is the capital.", "Paris is the capital.", []),
        (
            (
                "I'll look it up.\n<tool_call>\n<function=get_weather>\n<parameter=city>\n"
                "San Francisco\n</parameter>\n<parameter=unit>\ncelsius\n</parameter>\n"
                "</function>\n</tool_call>"
            ),
            "I'll look it up.\n",
            [("get_weather", {"city": "San Francisco", "unit": "celsius"})],
        ),
        (
            (
                '<tool_call>\n<function=write_file>\n<parameter=path>\n/tmp/a "b".py\n'
                "</parameter>\n<parameter=content>\ndef f(x):\n    return x < 2  # é\n\n"
                "</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=ping>\n"
                "</function>\n</tool_call>"
            ),
            None,
            [("write_file", {"path": '/tmp/a "b".py',
                             "content": "def f(x):\n    return x < 2  # é\n"}),
             ("ping", {})],
        ),
        # The end token stopped generation before </tool_call>.
        (
            "<tool_call>\n<function=search>\n<parameter=q>\nx\n</parameter>\n</function>",
            None,
            [("search", {"q": "x"})],
        ),
    ],
    # DeepSeek-V3's template: a fenced JSON block per call.
    "deepseek_v3": [
        ("No call needed.", "No call needed.", []),
        (
            (
                "Let me check.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>"
                'get_weather\n```json\n{"location": "Tokyo", "days": [1, 2]}\n```'
                "<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n"
                '```json\n{"tz": "Asia/Tokyo \\"JST\\""}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>'
            ),
            "Let me check.",
            [("get_weather", {"location": "Tokyo", "days": [1, 2]}),
             ("get_time", {"tz": 'Asia/Tokyo "JST"'})],
        ),
        (
            (
                "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n"
                '{\n  "a": {"b": "```"}\n}\n```<｜tool▁call▁end｜>'
            ),
            None,
            [("f", {"a": {"b": "```"}})],
        ),
    ],
    # DeepSeek-V3.1's template: the name, then the JSON arguments, no fence.
    "deepseek_v31": [
        ("Hello.", "Hello.", []),
        (
            (
                "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>"
                '{"city": "北京"}<｜tool▁call▁end｜><｜tool▁call▁begin｜>add<｜tool▁sep｜>'
                '{"a": 1, "b": {"c": "<｜tool▁call▁end｜>"}}<｜tool▁call▁end｜><｜tool▁calls▁end｜>'
            ),
            None,
            [("get_weather", {"city": "北京"}), ("add", {"a": 1, "b": {"c": "<｜tool▁call▁end｜>"}})],
        ),
    ],
    # Granite 3.0 (<|tool_call|>, a special token) and 3.1 (<tool_call>, text).
    "granite": [
        ("The answer is 4.", "The answer is 4.", []),
        (
            (
                '<|tool_call|>[{"name": "get_current_weather", "arguments": {"city": "Boston", '
                '"unit": "celsius"}}, {"name": "get_time", "arguments": {}}]'
            ),
            None,
            [("get_current_weather", {"city": "Boston", "unit": "celsius"}), ("get_time", {})],
        ),
        (
            'Sure. <tool_call> [{"arguments": {"q": "a ] b"}, "name": "search"}, {"name": "now"}]',
            "Sure. ",
            [("search", {"q": "a ] b"}), ("now", {})],
        ),
    ],
    # gpt-oss's Harmony messages, special tokens kept.
    "openai": [
        ("<|channel|>final<|message|>It is sunny.", "It is sunny.", []),
        (
            (
                "<|channel|>analysis<|message|>User wants weather. Call the tool.<|end|>"
                "<|start|>assistant<|channel|>commentary to=functions.get_weather "
                '<|constrain|>json<|message|>{"location": "San Francisco"}'
            ),
            None,
            [("get_weather", {"location": "San Francisco"})],
        ),
        (
            (
                "<|channel|>analysis<|message|>Two calls.<|end|><|start|>assistant"
                "<|channel|>commentary<|message|>Checking both.<|end|><|start|>assistant"
                '<|channel|>commentary to=functions.a <|constrain|>json<|message|>{"x": [1]}'
                "<|call|><|start|>assistant<|channel|>commentary to=functions.b<|message|>{}<|call|>"
            ),
            "Checking both.",
            [("a", {"x": [1]}), ("b", {})],
        ),
    ],
}
