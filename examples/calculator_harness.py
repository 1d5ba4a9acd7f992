"""An agent harness that knows only the OpenAI client: a calculator agent (no rollwise imports).

rollwise trains it with ``rollout.harness: examples.calculator_harness:rollout``
(recipes/tiny_calculator_harness.yaml): every call it makes goes to the run's endpoint, which
records the sampled tokens; the returned value is the reward (None = the task's verifier scores
the final answer). The same agent runs unchanged against any OpenAI-compatible server.
"""

import ast
import json
import operator

TOOLS = [{
    "type": "function",
    "function": {
        "name": "calculate",
        "description": "Evaluate an arithmetic expression exactly.",
        "parameters": {"type": "object", "properties": {"expression": {
            "type": "string", "description": 'numbers with + - * and parentheses, e.g. "(12 + 7) * 3"'}},
            "required": ["expression"]},
    },
}]
MAX_TURNS = 2  # a call, then the answer

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def calculate(expression: str) -> str:
    """Integer arithmetic read with ast (never eval)."""
    def value(node):
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](value(node.left), value(node.right))
        raise ValueError("only integers, + - * and parentheses")
    return str(value(ast.parse(expression.strip(), mode="eval").body))


async def rollout(client, row):
    messages = [{"role": "user", "content": row["prompt"]}]
    for turn in range(MAX_TURNS):
        reply = await client.chat.completions.create(model=row["model"], messages=messages, tools=TOOLS)
        message = reply.choices[0].message
        if not message.tool_calls or turn + 1 == MAX_TURNS:
            return None  # the answer: the task's verifier scores it
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls:
            try:
                result = calculate(json.loads(call.function.arguments)["expression"])
            except (ValueError, KeyError, SyntaxError, TypeError) as err:
                result = f"error: {err}"
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return None
