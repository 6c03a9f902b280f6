package chat

import "strings"

// Queries are the questions asked, in turn.
var Queries = []string{
	"How does a token bucket refill?", "What is weighted fair queuing?", "How do leased permits work?",
	"What is continuous batching?", "Why does the P99/P50 ratio matter?", "How are Redis streams used for SSE?",
	"What does Temporal replay check?", "How is a KV cache paged?", "What is a retry storm?", "How do caches stay fresh?",
}

// LongQuery is long enough that its prompt bound exceeds the short pool's
// routing threshold.
var LongQuery = strings.Repeat("Explain how weighted fair queuing shares one pool of permits between tenants. ", 30)
