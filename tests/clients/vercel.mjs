// The Vercel AI SDK (`ai` with `@ai-sdk/openai` and `@ai-sdk/anthropic`) against the gateway.
//
// Driven by tests/clients.rs: reads one case a line on stdin,
// `{"id","client":"responses"|"chat"|"anthropic","op":"generate"|"stream"|"chat2"|"tools","model"}`,
// and answers each with one line on stdout, `{"id","ok":true,"result":{…}}` or
// `{"id","ok":false,"error":"…"}`. The test asserts on the result and on what the mock provider
// received. GATEWAY_BASE_URL and GATEWAY_API_KEY come from the environment.
import { createInterface } from "node:readline";

import { createAnthropic } from "@ai-sdk/anthropic";
import { createOpenAI } from "@ai-sdk/openai";
import { generateText, stepCountIs, streamText, tool } from "ai";
import { z } from "zod";

const base = process.env.GATEWAY_BASE_URL;
const apiKey = process.env.GATEWAY_API_KEY;
const openai = createOpenAI({ baseURL: `${base}/v1`, apiKey });
const anthropic = createAnthropic({ baseURL: `${base}/alt/v1`, apiKey });

/** The language model of a case: the default (Responses) model, the chat model or Anthropic's. */
function languageModel(client, id) {
  switch (client) {
    case "responses":
      return openai(id);
    case "chat":
      return openai.chat(id);
    case "anthropic":
      return anthropic(id);
    default:
      throw new Error(`unknown client ${client}`);
  }
}

function usage(u) {
  return {
    input: u?.inputTokens ?? null,
    output: u?.outputTokens ?? null,
    cached: u?.inputTokenDetails?.cacheReadTokens ?? null,
  };
}

const weather = tool({
  description: "The weather in a city",
  inputSchema: z.object({ city: z.string() }),
  execute: async ({ city }) => `sunny, 21 C in ${city}`,
});

// No retries: a refused request shows its own error, not a retry wrapper's.
const common = { maxRetries: 0 };

async function run({ client, op, model: id }) {
  const model = languageModel(client, id);
  switch (op) {
    case "generate": {
      const r = await generateText({ ...common, model, prompt: "Say hello." });
      return { text: r.text, finish: r.finishReason, usage: usage(r.usage) };
    }
    case "stream": {
      const r = streamText({ ...common, model, prompt: "Say hello." });
      let text = "";
      for await (const part of r.fullStream) {
        if (part.type === "text-delta") text += part.text;
        if (part.type === "error") throw part.error;
      }
      return {
        text,
        final_text: await r.text,
        finish: await r.finishReason,
        usage: usage(await r.usage),
      };
    }
    case "chat2": {
      const messages = [{ role: "user", content: "Hello, who are you?" }];
      const first = await generateText({ ...common, model, messages });
      messages.push(...first.response.messages, { role: "user", content: "Tell me more." });
      const second = await generateText({ ...common, model, messages });
      return { texts: [first.text, second.text], usage: usage(second.usage) };
    }
    case "tools": {
      const r = await generateText({
        ...common,
        model,
        prompt: "What is the weather in Paris?",
        tools: { get_weather: weather },
        stopWhen: stepCountIs(4),
      });
      const calls = r.steps.flatMap((s) => s.toolCalls);
      const results = r.steps.flatMap((s) => s.toolResults);
      return {
        text: r.text,
        steps: r.steps.length,
        tool_calls: calls.map((c) => ({ name: c.toolName, args: c.input })),
        tool_results: results.map((t) => t.output),
        usage: usage(r.totalUsage),
      };
    }
    default:
      throw new Error(`unknown op ${op}`);
  }
}

/** The error as the test shows it: the HTTP status and body of a refused call when there is one. */
function describe(e) {
  const parts = [`${e?.name ?? "Error"}: ${e?.message ?? String(e)}`];
  if (e?.statusCode !== undefined) parts.push(`status ${e.statusCode}`);
  if (e?.responseBody) parts.push(`body ${e.responseBody}`);
  if (e?.cause && e.cause !== e) parts.push(`cause ${describe(e.cause)}`);
  return parts.join("; ");
}

for await (const line of createInterface({ input: process.stdin })) {
  if (!line.trim()) continue;
  const c = JSON.parse(line);
  let answer;
  try {
    answer = { id: c.id, ok: true, result: await run(c) };
  } catch (e) {
    answer = { id: c.id, ok: false, error: describe(e) };
  }
  process.stdout.write(`${JSON.stringify(answer)}\n`);
}
