// The official npm client, unchanged, against a running Sluice. Run by
// tests/integration/jsclient_test.go, which starts the stack and sets
//   SLUICE_BASE_URL  the OpenAI base URL (http://.../v1)
//   SLUICE_KEY       an API key
//   SLUICE_MODEL     a backend model the pools serve
//   SLUICE_KB        a knowledge base the key may read
//   SLUICE_EMBED     the embedding model
import { test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI, { toFile } from 'openai';

const env = (name) => {
  const v = process.env[name];
  if (!v) throw new Error(`${name} is not set`);
  return v;
};
const client = new OpenAI({ baseURL: env('SLUICE_BASE_URL'), apiKey: env('SLUICE_KEY'), maxRetries: 0, timeout: 60_000 });
const model = env('SLUICE_MODEL');
const kb = env('SLUICE_KB');

const weather = {
  type: 'function',
  function: {
    name: 'get_weather',
    description: 'The weather in a city now.',
    parameters: { type: 'object', properties: { city: { type: 'string' }, unit: { type: 'string', enum: ['celsius', 'fahrenheit'] } }, required: ['city'] },
  },
};

test('models.list names the backend model and the RAG aliases', async () => {
  const ids = [];
  for await (const m of client.models.list()) ids.push(m.id);
  for (const want of [model, 'sluice-rag', `sluice-rag/${kb}`, env('SLUICE_EMBED')]) {
    assert.ok(ids.includes(want), `${want} missing from ${ids}`);
  }
});

test('a gateway completion answers the whole conversation', async () => {
  const c = await client.chat.completions.create({
    model,
    messages: [
      { role: 'system', content: 'Be brief.' },
      { role: 'user', content: 'Name a queue.' },
      { role: 'assistant', content: 'A FIFO.' },
      { role: 'user', content: 'Another one?' },
    ],
    max_tokens: 16, temperature: 0, seed: 7,
  });
  assert.equal(c.object, 'chat.completion');
  assert.equal(c.model, model);
  assert.ok(c.id.startsWith('chatcmpl-'));
  assert.ok(c.choices[0].message.content.length > 0);
  assert.equal(c.usage.total_tokens, c.usage.prompt_tokens + c.usage.completion_tokens);
  // The same seed and prompt give the same answer: the seed reached the model.
  const again = await client.chat.completions.create({
    model, messages: [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'Name a queue.' },
      { role: 'assistant', content: 'A FIFO.' }, { role: 'user', content: 'Another one?' }],
    max_tokens: 16, temperature: 0, seed: 7,
  });
  assert.equal(again.choices[0].message.content, c.choices[0].message.content);
});

test('a streamed gateway answer ends with the usage chunk', async () => {
  const stream = await client.chat.completions.create({
    model, messages: [{ role: 'user', content: 'Count to five.' }], max_tokens: 12, stream: true, stream_options: { include_usage: true },
  });
  let text = '';
  let finish = null;
  let usage = null;
  for await (const chunk of stream) {
    assert.equal(chunk.object, 'chat.completion.chunk');
    assert.equal(chunk.model, model);
    if (chunk.usage) usage = chunk.usage;
    for (const ch of chunk.choices) {
      text += ch.delta.content ?? '';
      finish = ch.finish_reason ?? finish;
    }
  }
  assert.ok(text.length > 0);
  assert.ok(['stop', 'length'].includes(finish), `finish ${finish}`);
  assert.ok(usage && usage.completion_tokens > 0);
});

test('a tool call is streamed, then its result answered', async () => {
  const question = { role: 'user', content: 'What is the weather in Paris?' };
  const runner = client.chat.completions.stream({ model, messages: [question], tools: [weather] });
  const finished = [];
  runner.on('tool_calls.function.arguments.done', (e) => finished.push(e));
  const first = await runner.finalChatCompletion();
  const choice = first.choices[0];
  assert.equal(choice.finish_reason, 'tool_calls');
  assert.equal(choice.message.tool_calls.length, 1);
  const call = choice.message.tool_calls[0];
  assert.equal(call.type, 'function');
  assert.equal(call.function.name, 'get_weather');
  assert.equal(typeof JSON.parse(call.function.arguments).city, 'string');
  assert.equal(finished.length, 1);
  assert.equal(finished[0].name, 'get_weather');

  const answer = await client.chat.completions.create({
    model, tools: [weather], max_tokens: 24,
    messages: [question, choice.message, { role: 'tool', tool_call_id: call.id, content: '{"temp_c": 18, "sky": "clear"}' }],
  });
  assert.ok(['stop', 'length'].includes(answer.choices[0].finish_reason));
  assert.ok(answer.choices[0].message.content.length > 0);
});

test('a named tool is called without streaming', async () => {
  const c = await client.chat.completions.create({
    model, messages: [{ role: 'user', content: 'Weather in Oslo?' }], tools: [weather],
    tool_choice: { type: 'function', function: { name: 'get_weather' } },
  });
  assert.equal(c.choices[0].finish_reason, 'tool_calls');
  assert.equal(c.choices[0].message.content, null);
  assert.equal(c.choices[0].message.tool_calls[0].function.name, 'get_weather');
});

test('n answers come back as n choices', async () => {
  const c = await client.chat.completions.create({
    model, messages: [{ role: 'user', content: 'Name a queueing discipline.' }], n: 2, max_tokens: 10,
  });
  assert.deepEqual(c.choices.map((ch) => ch.index), [0, 1]);
  assert.ok(c.choices.every((ch) => ch.message.content.length > 0));
  assert.notEqual(c.choices[0].message.content, c.choices[1].message.content);
});

test('RAG mode answers from a knowledge base', async () => {
  const c = await client.chat.completions.create({
    model: `sluice-rag/${kb}`, messages: [{ role: 'user', content: 'How does a token bucket refill?' }], max_tokens: 20,
  });
  assert.equal(c.model, model);
  assert.ok(c.choices[0].message.content.length > 0);
  assert.ok(c.sluice && c.sluice.kb_version > 0, `sluice extension ${JSON.stringify(c.sluice)}`);
});

test('embeddings come back decoded from the default base64', async () => {
  const e = await client.embeddings.create({ model: env('SLUICE_EMBED'), input: ['token bucket', 'leaky bucket'] });
  assert.equal(e.data.length, 2);
  const [a, b] = e.data.map((d) => d.embedding);
  assert.ok(Array.isArray(a) && a.length > 0 && a.length === b.length);
  assert.ok(a.every((x) => typeof x === 'number' && Number.isFinite(x)));
  assert.notDeepEqual(a, b);
  assert.ok(e.usage.prompt_tokens > 0);
});

test('refusals are the typed errors the client raises', async () => {
  await assert.rejects(
    client.chat.completions.create({ model: 'no-such-model', messages: [{ role: 'user', content: 'hi' }] }),
    (err) => err instanceof OpenAI.NotFoundError && err.code === 'model_not_found' && err.param === 'model',
  );
  await assert.rejects(
    client.chat.completions.create({ model, messages: [{ role: 'user', content: 'hi' }], logprobs: true }),
    (err) => err instanceof OpenAI.BadRequestError && err.code === 'unsupported_parameter' && err.param === 'logprobs',
  );
  await assert.rejects(
    client.chat.completions.create({ model, messages: [{ role: 'user', content: 'hi' }], temperature: 9 }),
    (err) => err instanceof OpenAI.BadRequestError && err.param === 'temperature',
  );
});

const getWeather = {
  type: 'function', name: 'get_weather', description: weather.function.description, parameters: weather.function.parameters,
};

test('responses.create answers a string input', async () => {
  const r = await client.responses.create({ model, input: 'Name a queue.', instructions: 'Be brief.', max_output_tokens: 16 });
  assert.equal(r.object, 'response');
  assert.ok(r.id.startsWith('resp_'), r.id);
  assert.ok(['completed', 'incomplete'].includes(r.status), r.status);
  assert.equal(r.model, model);
  assert.ok(r.output_text.length > 0);
  assert.equal(r.output[0].type, 'message');
  assert.equal(r.usage.total_tokens, r.usage.input_tokens + r.usage.output_tokens);
});

test('responses.create cut at max_output_tokens is incomplete', async () => {
  const r = await client.responses.create({ model, input: 'Tell me a long story about queues.', max_output_tokens: 3 });
  assert.equal(r.status, 'incomplete');
  assert.equal(r.incomplete_details.reason, 'max_output_tokens');
  assert.equal(r.usage.output_tokens, 3);
});

test('a streamed response numbers its events and ends completed', async () => {
  const stream = await client.responses.create({ model: `sluice-rag/${kb}`, input: 'How does a token bucket refill?', max_output_tokens: 20, stream: true });
  const types = [];
  let seq = -1;
  let text = '';
  let last = null;
  for await (const ev of stream) {
    assert.equal(ev.sequence_number, seq + 1, `event ${ev.type} numbered ${ev.sequence_number} after ${seq}`);
    seq = ev.sequence_number;
    types.push(ev.type);
    if (ev.type === 'response.output_text.delta') text += ev.delta;
    last = ev;
  }
  assert.equal(types[0], 'response.created');
  assert.ok(types.includes('response.in_progress'));
  assert.ok(['response.completed', 'response.incomplete'].includes(last.type), last.type);
  assert.ok(text.length > 0);
  assert.equal(last.response.output[0].content[0].text, text);
});

test('a response calls a tool, then answers its output', async () => {
  const runner = client.responses.stream({ model, input: 'What is the weather in Paris?', tools: [getWeather] });
  const first = await runner.finalResponse();
  const call = first.output.find((item) => item.type === 'function_call');
  assert.ok(call, `no function call in ${JSON.stringify(first.output)}`);
  assert.equal(call.name, 'get_weather');
  assert.equal(typeof JSON.parse(call.arguments).city, 'string');
  const answer = await client.responses.create({
    model, tools: [getWeather], max_output_tokens: 24,
    input: [{ role: 'user', content: 'What is the weather in Paris?' }, call,
      { type: 'function_call_output', call_id: call.call_id, output: '{"temp_c": 18, "sky": "clear"}' }],
  });
  assert.ok(answer.output_text.length > 0);
});

test('a stored response is retrieved, continued and deleted', async () => {
  const first = await client.responses.create({ model, input: 'Name a queue.', max_output_tokens: 16 });
  const again = await client.responses.retrieve(first.id);
  assert.equal(again.id, first.id);
  assert.equal(again.output_text, first.output_text);
  const next = await client.responses.create({ model, input: 'And another?', previous_response_id: first.id, max_output_tokens: 16 });
  assert.equal(next.previous_response_id, first.id);
  assert.ok(next.usage.input_tokens > first.usage.input_tokens, 'the continued prompt holds the first turn');
  const items = [];
  for await (const item of client.responses.inputItems.list(next.id)) items.push(item);
  assert.equal(items.length, 1);
  assert.equal(items[0].content[0].text, 'And another?');
  await client.responses.delete(first.id);
  await assert.rejects(client.responses.retrieve(first.id), (err) => err instanceof OpenAI.NotFoundError);
  await assert.rejects(
    client.responses.create({ model, input: 'hi', previous_response_id: first.id }),
    (err) => err instanceof OpenAI.NotFoundError && err.param === 'previous_response_id',
  );
});

// The simulator answers exactly n tokens when the prompt starts so.
const answerTokens = (n) => `[llmsim answer_tokens=${n}] `;

test('a background response runs with no client, and streams again from starting_after', async () => {
  const created = await client.responses.create({ model, input: `${answerTokens(24)}Name a queue.`, max_output_tokens: 40, background: true });
  assert.equal(created.status, 'queued');
  assert.equal(created.background, true);
  const read = async (query) => {
    const events = [];
    for await (const ev of await client.responses.retrieve(created.id, { ...query, stream: true })) events.push(ev);
    return events;
  };
  const all = await read({});
  assert.equal(all[0].type, 'response.created');
  assert.equal(all.at(-1).type, 'response.completed');
  all.forEach((ev, i) => assert.equal(ev.sequence_number, i));
  const mid = Math.floor(all.length / 2);
  assert.deepEqual(await read({ starting_after: mid }), all.slice(mid + 1));
  const done = await client.responses.retrieve(created.id);
  assert.equal(done.status, 'completed');
  assert.equal(done.usage.output_tokens, 24);
  assert.equal(done.output_text, all.at(-1).response.output[0].content[0].text);
});

test('a background response is cancelled mid-answer', async () => {
  const created = await client.responses.create({ model, input: `${answerTokens(1000)}Tell me about queues.`, max_output_tokens: 1000, background: true });
  let r = created;
  while (r.status === 'queued' || (r.status === 'in_progress' && r.output.length === 0)) {
    await new Promise((resolve) => setTimeout(resolve, 20));
    r = await client.responses.retrieve(created.id);
  }
  assert.equal(r.status, 'in_progress');
  const cancelled = await client.responses.cancel(created.id);
  assert.equal(cancelled.status, 'cancelled');
  await assert.rejects(
    client.responses.create({ model, input: 'hi', background: true, store: false }),
    (err) => err instanceof OpenAI.BadRequestError && err.param === 'store',
  );
});

test('a batch file is uploaded, read back, and a bad one refused naming its lines', async () => {
  const line = (i) => JSON.stringify({ custom_id: `r${i}`, method: 'POST', url: '/v1/chat/completions',
    body: { model, messages: [{ role: 'user', content: `Line ${i}.` }], max_tokens: 8 } });
  const content = [1, 2, 3].map(line).join('\n') + '\n';
  const f = await client.files.create({ file: await toFile(Buffer.from(content), 'three.jsonl'), purpose: 'batch' });
  assert.equal(f.object, 'file');
  assert.equal(f.bytes, Buffer.byteLength(content));
  assert.equal(f.purpose, 'batch');
  const back = await client.files.content(f.id);
  assert.equal(await back.text(), content);
  const bad = `${line(1)}\nnot json\n${line(1)}\n`;
  await assert.rejects(
    client.files.create({ file: await toFile(Buffer.from(bad), 'bad.jsonl'), purpose: 'batch' }),
    (err) => err instanceof OpenAI.BadRequestError && err.code === 'invalid_file' && err.error.bad_lines === 2
      && err.error.errors.data[0].line === 2 && err.error.errors.data[1].code === 'duplicate_custom_id',
  );
  await client.files.delete(f.id);
  await assert.rejects(client.files.retrieve(f.id), (err) => err instanceof OpenAI.NotFoundError);
});
