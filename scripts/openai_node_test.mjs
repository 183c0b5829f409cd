// The official OpenAI Node SDK, with its default retries, against a gateway limited to a request rate
// (started by scripts/openai_node.sh): issue #33, "hints that do not herd".
//
//   node scripts/openai_node_test.mjs BASE_URL      (e.g. http://127.0.0.1:8080/v1)
//
// Twelve streamed chat completions start at once through one client (`maxRetries` left at the SDK's
// default, 2), each read to its end. The SDK sleeps exactly `retry-after-ms` when a refusal carries a hint
// under a minute, without jitter, so refusals given the same hint come back together and are refused
// together again. The rate serves all twelve in 5.5 s; the gateway's hints decide how many get there.
//
// Refusals are counted on the gateway's side, from its /metrics before and after
// (`kvgate_gateway_responses_total` with status 429 or 503; `kvgate_requests_rejected_total` by reason
// shown next to it), and on the client's side by a wrapper around the SDK's own fetch, which also logs
// every hint (`retry-after-ms`) and when the SDK came back after it.
//
// Prints every attempt, then one summary line (served, failed, refusals, the hints). Asserts that all
// twelve are served with at most 15 refusals; with EXPECT=baseline it prints and exits 0 (for measuring
// a gateway without the fix). Env: OPENAI_NODE_DIR, the folder holding node_modules/openai (from
// scripts/openai_node.sh).
//
// Exit status: 0 passed (or baseline), 1 an assertion failed, 2 the harness itself failed.

import { createRequire } from 'node:module';
import { join } from 'node:path';

const REQUESTS = 12;
const MAX_REFUSALS = 15;
const WATCHDOG_MS = 90_000; // the whole run; the rate serves all twelve in 5.5 s
const REQUEST_TIMEOUT_MS = 30_000; // the SDK's per-attempt timeout (its default is 10 minutes)

const base = process.argv[2];
if (!base) {
  console.error('usage: openai_node_test.mjs BASE_URL');
  process.exit(2);
}
const baseline = process.env.EXPECT === 'baseline';
const origin = new URL(base).origin;

const require = createRequire(join(process.env.OPENAI_NODE_DIR ?? process.cwd(), 'package.json'));
const OpenAI = require('openai');
// The fetch the SDK uses when given none (node-fetch on Node), so that only the counting is added.
const { fetch: sdkFetch } = require('openai/_shims/index');
const { VERSION } = require('openai/version');

const watchdog = setTimeout(() => {
  console.error(`FAIL the run took longer than ${WATCHDOG_MS / 1000} s`);
  process.exit(2);
}, WATCHDOG_MS);

const started = performance.now();
const now = () => performance.now() - started;

/**
 * Every attempt the SDK made, in the order they were sent: `{ id, retry, sent, answered, status, hintMs,
 * hintS }` (times in ms since the start).
 */
const attempts = [];

/** Wraps the SDK's fetch: records each attempt of a completion request and the hint it got back. */
async function countingFetch(url, init) {
  const headers = init?.headers ?? {};
  const id = headers['x-harness-request'];
  if (id === undefined) return sdkFetch(url, init);
  const attempt = { id: Number(id), retry: Number(headers['x-stainless-retry-count'] ?? 0), sent: now() };
  attempts.push(attempt);
  try {
    const response = await sdkFetch(url, init);
    attempt.answered = now();
    attempt.status = response.status;
    const ms = response.headers.get('retry-after-ms');
    const s = response.headers.get('retry-after');
    if (ms !== null) attempt.hintMs = Number(ms);
    if (s !== null) attempt.hintS = Number(s);
    return response;
  } catch (e) {
    attempt.status = `error: ${e?.name ?? e}`;
    throw e;
  }
}

/** Sums the samples of one counter in a Prometheus text page whose labels pass `keep`. */
function sum(page, name, keep = () => true) {
  let total = 0;
  for (const line of page.split('\n')) {
    const m = line.match(/^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([^}]*)\})?\s+(\S+)/);
    if (!m || m[1] !== name) continue;
    const labels = Object.fromEntries(
      [...(m[3] ?? '').matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g)].map((l) => [l[1], l[2]]),
    );
    if (keep(labels)) total += Number(m[4]);
  }
  return total;
}

/** The gateway's refusal counters now. */
async function gatewayCounts() {
  const response = await fetch(`${origin}/metrics`, { signal: AbortSignal.timeout(5_000) });
  if (!response.ok) throw new Error(`GET /metrics: ${response.status}`);
  const page = await response.text();
  const reasons = {};
  for (const line of page.split('\n')) {
    const m = line.match(/^kvgate_requests_rejected_total\{.*reason="([^"]*)"/);
    if (m) reasons[m[1]] = sum(page, 'kvgate_requests_rejected_total', (l) => l.reason === m[1]);
  }
  return {
    s429: sum(page, 'kvgate_gateway_responses_total', (l) => l.status === '429'),
    s503: sum(page, 'kvgate_gateway_responses_total', (l) => l.status === '503'),
    s200: sum(page, 'kvgate_gateway_responses_total', (l) => l.status === '200'),
    reasons,
  };
}

const client = new OpenAI({ baseURL: base, apiKey: 'sk-node', timeout: REQUEST_TIMEOUT_MS, fetch: countingFetch });
if (client.maxRetries !== 2) {
  console.error(`FAIL the SDK's default maxRetries is ${client.maxRetries}, not 2: the harness assumes 2`);
  process.exit(2);
}

/** One request: a streamed chat completion read to its end. */
async function one(id) {
  const stream = await client.chat.completions.create(
    {
      model: 'kvgate-sim',
      messages: [{ role: 'user', content: `Say hello, number ${id}.` }],
      max_tokens: 16,
      stream: true,
    },
    { headers: { 'x-harness-request': String(id) } },
  );
  let chunks = 0;
  let text = '';
  for await (const chunk of stream) {
    chunks += 1;
    text += chunk.choices?.[0]?.delta?.content ?? '';
  }
  if (chunks < 2 || !text) throw new Error(`a short stream: ${chunks} chunks, ${JSON.stringify(text)}`);
  return { chunks, done: now() };
}

let before;
try {
  before = await gatewayCounts();
} catch (e) {
  console.error(`FAIL reading the gateway's /metrics: ${e}`);
  process.exit(2);
}
const results = await Promise.allSettled(Array.from({ length: REQUESTS }, (_, id) => one(id)));
const elapsed = now();
let after;
try {
  after = await gatewayCounts();
} catch (e) {
  console.error(`FAIL reading the gateway's /metrics: ${e}`);
  process.exit(2);
}
clearTimeout(watchdog);

// Every attempt, with the hint it got and when the SDK came back after it.
console.log(`openai ${VERSION} (Node ${process.version}), maxRetries ${client.maxRetries}, ${REQUESTS} streamed requests`);
const fmt = (ms) => `${(ms / 1000).toFixed(3)}s`;
for (const a of attempts) {
  const next = attempts.find((b) => b.id === a.id && b.retry === a.retry + 1);
  const hint = a.hintMs !== undefined ? ` retry-after-ms ${a.hintMs} (aims at ${fmt(a.answered + a.hintMs)})` : '';
  const back = next ? `, back after ${Math.round(next.sent - a.sent)} ms` : '';
  console.log(`  #${String(a.id).padStart(2)} try ${a.retry} at ${fmt(a.sent)}: ${a.status}${hint}${back}`);
}
const served = results.filter((r) => r.status === 'fulfilled').length;
const failed = REQUESTS - served;
for (const [id, r] of results.entries()) {
  if (r.status === 'rejected') {
    const e = r.reason;
    console.log(`  #${String(id).padStart(2)} failed: ${e?.constructor?.name ?? 'Error'}: ${e?.message ?? e}`);
  }
}

const refused429 = after.s429 - before.s429;
const refused503 = after.s503 - before.s503;
const refusals = refused429 + refused503;
const byReason = Object.entries(after.reasons)
  .map(([reason, n]) => [reason, n - (before.reasons[reason] ?? 0)])
  .filter(([, n]) => n > 0)
  .map(([reason, n]) => `${reason}=${n}`)
  .join(' ');
const clientRefusals = attempts.filter((a) => a.status === 429 || a.status === 503).length;
const hints = attempts.filter((a) => a.hintMs !== undefined).map((a) => a.hintMs);
const distinct = [...new Set(hints)].sort((a, b) => a - b);
// Refusals per try, and how far apart the instants their hints aim at are: a herd aims at one instant.
const tries = [...new Set(attempts.map((a) => a.retry))].sort((a, b) => a - b);
const refusedAt = (r) => attempts.filter((a) => a.retry === r && (a.status === 429 || a.status === 503));
const rounds = tries.map((r) => refusedAt(r).length);
const spreads = tries.map((r) => {
  const aims = refusedAt(r).filter((a) => a.hintMs !== undefined).map((a) => a.answered + a.hintMs);
  return aims.length ? `${Math.round(Math.max(...aims) - Math.min(...aims))} ms` : '-';
});

console.log(
  `summary: served ${served}/${REQUESTS}, failed ${failed}, refusals ${refusals} ` +
    `(gateway: 429 ${refused429}, 503 ${refused503}; rejected ${byReason || 'none'}; client saw ${clientRefusals}; ` +
    `by try ${rounds.join('/')}), ${attempts.length} attempts in ${fmt(elapsed)}, ` +
    `hints ms [${hints.join(', ')}] (${distinct.length} distinct, ${distinct[0] ?? '-'}..${distinct.at(-1) ?? '-'}; ` +
    `the instants each try's hints aim at spread over ${spreads.join('/')})`,
);

if (baseline) {
  console.log('EXPECT=baseline: measured only, nothing asserted');
  process.exit(0);
}
const problems = [];
if (served !== REQUESTS) problems.push(`${served} of ${REQUESTS} served, want all`);
if (refusals > MAX_REFUSALS) problems.push(`${refusals} refusals, want at most ${MAX_REFUSALS}`);
if (clientRefusals !== refusals) problems.push(`the client saw ${clientRefusals} refusals, the gateway counted ${refusals}`);
for (const p of problems) console.log(`FAIL ${p}`);
if (problems.length === 0) console.log('ok   hints that do not herd');
process.exit(problems.length ? 1 : 0);
