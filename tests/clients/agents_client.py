"""The OpenAI Agents SDK against the gateway: one agent with one function tool, on the
chat-completions model and on the Responses model.

Cases (see caseloop.py): `{"id", "client": "chat"|"responses", "op": "run", "model"}`.
"""
import asyncio
import json

from agents import (
    Agent,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    Runner,
    ToolCallItem,
    ToolCallOutputItem,
    function_tool,
    set_tracing_disabled,
)
from openai import AsyncOpenAI

from caseloop import BASE, KEY, serve, weather

# Tracing exports to OpenAI's servers; nothing may leave the machine.
set_tracing_disabled(True)
# One loop for every case: the clients of earlier cases close their connections on it.
LOOP = asyncio.new_event_loop()


@function_tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    return weather(city)


def agent_model(client, model):
    openai = AsyncOpenAI(base_url=f"{BASE}/v1", api_key=KEY, max_retries=0)
    if client == "chat":
        return OpenAIChatCompletionsModel(model=model, openai_client=openai)
    if client == "responses":
        return OpenAIResponsesModel(model=model, openai_client=openai)
    raise ValueError(f"unknown client {client}")


def run(case):
    agent = Agent(
        name="weather",
        instructions="Answer weather questions with the tool.",
        tools=[get_weather],
        model=agent_model(case["client"], case["model"]),
    )
    result = LOOP.run_until_complete(Runner.run(agent, "What is the weather in Paris?", max_turns=4))
    calls = [i.raw_item for i in result.new_items if isinstance(i, ToolCallItem)]
    outputs = [i.output for i in result.new_items if isinstance(i, ToolCallOutputItem)]
    u = result.context_wrapper.usage
    return {
        "text": result.final_output,
        "steps": u.requests,
        "tool_calls": [{"name": c.name, "args": json.loads(c.arguments)} for c in calls],
        "tool_results": outputs,
        "usage": {
            "input": u.input_tokens,
            "output": u.output_tokens,
            "cached": u.input_tokens_details.cached_tokens,
        },
    }


serve(run)
