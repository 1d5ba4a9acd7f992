"""An agent harness that knows only the OpenAI client: a calculator agent (no rollwise imports).

rollwise trains it with ``rollout.harness: examples.calculator_harness:rollout``: every call it
makes goes to the run's endpoint, which records the sampled tokens; the returned value is the
reward (None = the task's verifier scores the final answer). The same agent runs unchanged against
any OpenAI-compatible server.

It sends the row's conversation as it is (``row["messages"]``: reasoning-gym's system message and
question with its answer-format instructions; a bare-text prompt as one user message) and
``TOOLS``, the schema of rollwise's built-in ``calculator`` environment, so a chat model sees
through the endpoint exactly the prompt an in-process episode (and the SFT warm start) renders:
recipes/tiny_calculator_harness.yaml (the tiny model, plain format) and
recipes/smollm2_tools_harness.yaml (SmolLM2, hermes in a system message: its template ignores
``tools``). Its calculator computes what the environment's does.
"""

import ast
import json
import math
import operator

# what transformers.utils.get_json_schema makes of the environment's calculate (the "return" entry too): a
# chat model whose template ignores `tools` is shown this JSON in a system message, so it must match exactly
TOOLS = [{
    "type": "function",
    "function": {
        "name": "calculate",
        "description": "Evaluate an arithmetic expression exactly.",
        "parameters": {"type": "object", "properties": {"expression": {
            "type": "string", "description": 'numbers with + - * / // % ** and parentheses, e.g. "(12 + 7) * 3"'}},
            "required": ["expression"]},
        "return": {"type": "string"},
    },
}]
MAX_TURNS = 2  # a call, then the answer
MAX_BITS = 14_000  # a bigger integer is refused before it is computed (a huge power would hold the CPU)

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}


def _value(node):
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_value(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _value(node.left), _value(node.right)
        if type(left) is int and type(right) is int:
            bits = (left.bit_length() + right.bit_length() if isinstance(node.op, ast.Mult) else
                    right * math.log2(abs(left)) if isinstance(node.op, ast.Pow) and right > 0 and abs(left) > 1
                    else 0)
            if bits > MAX_BITS:
                raise ValueError(f"the result would be too large (over {MAX_BITS} bits)")
        return _BINARY[type(node.op)](left, right)
    raise ValueError("only numbers, + - * / // % ** and parentheses are allowed")


def calculate(expression: str) -> str:
    """Arithmetic read with ast (never eval); a whole float is written as an integer."""
    if not isinstance(expression, str):  # the model's JSON may hold anything there
        raise TypeError(f"expression must be text, not {type(expression).__name__}")
    try:
        result = _value(ast.parse(expression.strip(), mode="eval").body)
    except SyntaxError:
        raise ValueError(f"cannot parse {expression[:60]!r}") from None
    return str(int(result)) if isinstance(result, float) and result.is_integer() else str(result)


async def rollout(client, row):
    messages = [dict(m) for m in row["messages"]]
    for turn in range(MAX_TURNS):
        reply = await client.chat.completions.create(model=row["model"], messages=messages, tools=TOOLS)
        message = reply.choices[0].message
        if not message.tool_calls or turn + 1 == MAX_TURNS:
            return None  # the answer: the task's verifier scores it
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls:
            try:
                result = calculate(json.loads(call.function.arguments)["expression"])
            except (ValueError, KeyError, TypeError, ArithmeticError) as err:  # worded as rollwise's environment
                result = f"Error: calculate raised {type(err).__name__}: {err}"
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return None
