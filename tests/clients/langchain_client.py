"""LangChain against the gateway: `langchain-openai`'s ChatOpenAI on chat completions and on
the Responses API, and `langchain-anthropic`'s ChatAnthropic.

Cases (see caseloop.py): `{"id", "client": "chat"|"responses"|"anthropic",
"op": "invoke"|"stream"|"tools", "model"}`.
"""
from functools import reduce
from operator import add

from langchain_anthropic import ChatAnthropic
from langchain_core.messages import HumanMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI

from caseloop import BASE, KEY, serve, weather


@tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    return weather(city)


def chat_model(client, model):
    if client == "chat":
        # Usage in streams is opt-in for a base URL other than OpenAI's.
        return ChatOpenAI(model=model, base_url=f"{BASE}/v1", api_key=KEY, max_retries=0, stream_usage=True)
    if client == "responses":
        return ChatOpenAI(model=model, base_url=f"{BASE}/v1", api_key=KEY, max_retries=0, use_responses_api=True)
    if client == "anthropic":
        return ChatAnthropic(model=model, base_url=f"{BASE}/alt", api_key=KEY, max_retries=0)
    raise ValueError(f"unknown client {client}")


def usage(message):
    u = message.usage_metadata or {}
    return {
        "input": u.get("input_tokens"),
        "output": u.get("output_tokens"),
        "cached": (u.get("input_token_details") or {}).get("cache_read"),
    }


def run(case):
    model = chat_model(case["client"], case["model"])
    op = case["op"]
    if op == "invoke":
        r = model.invoke("Say hello.")
        return {"text": r.text, "usage": usage(r)}
    if op == "stream":
        chunks = list(model.stream("Say hello."))
        whole = reduce(add, chunks)
        return {"text": "".join(c.text for c in chunks), "final_text": whole.text, "usage": usage(whole)}
    if op == "tools":
        bound = model.bind_tools([get_weather])
        messages = [HumanMessage("What is the weather in Paris?")]
        first = bound.invoke(messages)
        messages.append(first)
        results = []
        for call in first.tool_calls:
            result = get_weather.invoke(call["args"])
            results.append(result)
            messages.append(ToolMessage(result, tool_call_id=call["id"]))
        final = bound.invoke(messages)
        u1, u2 = usage(first), usage(final)
        return {
            "text": final.text,
            "steps": 2,
            "tool_calls": [{"name": c["name"], "args": c["args"]} for c in first.tool_calls],
            "tool_results": results,
            "final_tool_calls": len(final.tool_calls),
            "usage": {k: (u1[k] or 0) + (u2[k] or 0) for k in u1},
        }
    raise ValueError(f"unknown op {op}")


serve(run)
