// Package llmsim is a simulator of a continuous-batching LLM inference
// server (in the manner of vLLM) that speaks the OpenAI chat completions API.
//
// It is not a model. No weights are loaded and no GPU is used: the answers
// are deterministic filler words, and time is spent by sleeping for what a
// step of a batched decoder would take. What it does reproduce honestly is
// the scheduling that decides latency under load, because that is what
// Sluice protects against:
//
//   - token-iteration scheduling: every step admits waiting requests FIFO
//     while the batch has room (MaxNumSeqs) and the paged KV cache has free
//     blocks for the prompt, then every running sequence emits one token;
//   - step time grows with the batch (DecodeBase + B*DecodePerSeq) and with
//     the prompts prefilled in that step (PrefillPerToken per token), so long
//     requests slow down every short request that shares a batch with them;
//   - a sequence holds its KV blocks until it finishes, taking one more block
//     whenever it grows past the ones it has; when none is free the most
//     recently admitted sequence is preempted (vLLM's "recompute" policy) and
//     must prefill prompt and generated tokens again when it is readmitted;
//   - "static" mode, for comparison, forms a batch only when the previous one
//     has completely finished, and holds a finished request's reply until the
//     longest member of its batch is done.
//
// Faults (a hung engine, answers that stop after N tokens, HTTP 5xx, slow
// steps) are explicit modes for testing a gateway's deadlines and circuit
// breakers, off unless Config.Fault or POST /admin/config turns them on,
// for the server or one replica.
//
// The generation parameters a gateway forwards are checked within OpenAI's
// bounds and honoured without sampling: a request's seed picks another
// deterministic answer, stop sequences end it, response_format makes it a
// JSON object, and a request with tools gets a deterministic call to one
// (a text answer once the conversation holds the tool's result). A
// request for n choices is n sequences sharing one prompt: it is
// prefilled once and its full KV blocks are held once, while each
// sequence takes a batch slot and KV blocks of its own for its answer.
// Config.RefuseParams makes the server refuse chosen parameters, n among
// them, as a backend that lacks them does.
//
// It does not model attention cost growing with context length, chunked
// prefill, prefix caching, swapping to CPU memory, speculative decoding,
// or the effect of temperature, top_p, penalties or logit_bias on the
// text. One generated token is one word. See README.md for the API,
// metrics and run-time controls.
package llmsim
