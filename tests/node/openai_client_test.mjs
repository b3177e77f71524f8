// The official OpenAI Node client (npm `openai`) against a running `estream serve`.
//   node openai_client_test.mjs BASE_URL API_KEY
// Exits 0 when every check passes, 1 with a message otherwise.
import OpenAI from 'openai';

const [baseURL, apiKey] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0 });

function check(cond, what) {
  if (!cond) {
    console.error('FAIL: ' + what);
    process.exit(1);
  }
}

const models = await client.models.list();
const model = models.data[0].id;
check(typeof model === 'string' && model.length > 0, 'models.list gives the model id');
const retrieved = await client.models.retrieve(model);
check(retrieved.id === model && retrieved.object === 'model', 'models.retrieve gives the model object');
let missing = false;
try {
  await client.models.retrieve('no-such-model');
} catch (e) {
  missing = e instanceof OpenAI.NotFoundError && e.status === 404;
}
check(missing, 'models.retrieve of another id -> 404 NotFoundError');

// lm-evaluation-harness's loglikelihood request: echo + logprobs + max_tokens 1.
const c = await client.completions.create({ model, prompt: 'The capital of France is', max_tokens: 1, echo: true, logprobs: 1, temperature: 0 });
const lp = c.choices[0].logprobs;
check(lp.tokens.length >= 2, 'echo returns the prompt tokens and the next one');
check(lp.token_logprobs[0] === null, 'the first prompt token has no logprob');
check(lp.token_logprobs.slice(1).every((x) => typeof x === 'number' && x <= 0), 'logprobs are numbers <= 0');
check(lp.top_logprobs.slice(1).every((d) => Object.keys(d).length === 1), 'one top alternative per position');
check(c.choices[0].text.startsWith('The capital of France is'), 'echo starts with the prompt');
check(c.usage.prompt_tokens === lp.tokens.length - 1 && c.usage.completion_tokens === 1, 'usage');

// Token ids and a batch of prompts.
const c2 = await client.completions.create({ model, prompt: [[1, 2, 3], [4, 5]], max_tokens: 0, echo: true, logprobs: 0 });
check(c2.choices.length === 2 && c2.choices[1].logprobs.tokens.length === 2, 'token-id prompts');

// Prefill-only: longer completions are refused with a 400 the client raises as BadRequestError.
let refused = false;
try {
  await client.completions.create({ model, prompt: 'x', max_tokens: 5 });
} catch (e) {
  refused = e instanceof OpenAI.BadRequestError && e.status === 400;
}
check(refused, 'max_tokens 5 -> 400 BadRequestError');

// Embeddings: the client asks for base64 by default and decodes it; it must equal the floats.
const input = ['hello world', 'a second input'];
const e64 = await client.embeddings.create({ model, input });
const ef = await client.embeddings.create({ model, input, encoding_format: 'float' });
check(e64.data.length === 2 && ef.data.length === 2, 'one embedding per input');
for (let i = 0; i < 2; ++i) {
  const a = Array.from(e64.data[i].embedding), b = ef.data[i].embedding;
  check(a.length === b.length && a.length > 0, 'embedding sizes agree');
  check(a.every((x, k) => x === Math.fround(b[k])), 'base64 and float embeddings are the same floats');
}
check(ef.usage.prompt_tokens > 0, 'embedding usage');

// A wrong key is refused with 401.
let unauthorised = false;
try {
  await new OpenAI({ baseURL, apiKey: 'wrong', maxRetries: 0 }).models.list();
} catch (e) {
  unauthorised = e instanceof OpenAI.AuthenticationError && e.status === 401;
}
check(unauthorised, 'a wrong API key -> 401 AuthenticationError');
console.log('openai node client: all checks passed');
