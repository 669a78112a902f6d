"""A chat template in the Qwen2.5 / Qwen3 format, for random-weight models (no hub here to fetch the real
one): ChatML turns, tool signatures in the system turn, `<tool_call>` JSON blocks, `<tool_response>` turns,
and an empty `<think>` block when `enable_thinking` is false."""

QWEN_STYLE = """\
{%- set first_system = messages and messages[0].role == 'system' -%}
{%- if tools -%}
<|im_start|>system
{% if first_system %}{{ messages[0].content }}

{% endif %}You may call functions. Their signatures, inside <tools></tools>:
<tools>
{% for t in tools %}{{ t | tojson }}
{% endfor %}</tools>
For each call, reply with <tool_call>
{"name": <function-name>, "arguments": <args-json-object>}
</tool_call><|im_end|>
{% elif first_system -%}
<|im_start|>system
{{ messages[0].content }}<|im_end|>
{% endif -%}
{%- for m in messages -%}
{%- if m.role == 'system' -%}
{%- elif m.role == 'tool' -%}
<|im_start|>user
<tool_response>
{{ m.content }}
</tool_response><|im_end|>
{% elif m.role == 'assistant' -%}
<|im_start|>assistant
{{ m.content or '' }}
{%- for c in m.tool_calls or [] %}
<tool_call>
{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments | tojson }}}
</tool_call>
{%- endfor %}<|im_end|>
{% else -%}
<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
<|im_start|>assistant
{% if enable_thinking is defined and not enable_thinking %}<think>

</think>

{% endif -%}
{%- endif -%}
"""
