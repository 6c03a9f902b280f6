package llm

import "github.com/sluice-dev/sluice/pkg/request"

// Whether a pool's backend takes a request priority.
const (
	// PriorityNone: it takes none; nothing is sent.
	PriorityNone = "none"
	// PriorityVLLM: vLLM's priority field, with the server run under
	// --scheduling-policy priority (a vLLM run without it refuses any
	// priority but 0).
	PriorityVLLM = "vllm"
)

// PriorityOf is the vLLM priority of a request of the named service
// class: its rank less the default class's, so that the default class
// sends vLLM's own default (0), priority is sooner (-1) and flex later
// (1). An empty or unknown name is the default class's.
func PriorityOf(class string) int {
	rank, ok := request.ClassRank(class)
	if !ok {
		return 0
	}
	base, _ := request.ClassRank(request.ClassDefault)
	return rank - base
}

// withPriority is req as the pool's backend is sent it: with its
// priority when the backend takes one.
func (c *OpenAI) withPriority(req Request) Request {
	if c.priority == PriorityVLLM {
		p := req.Priority
		req.sendPriority = &p
	}
	return req
}
