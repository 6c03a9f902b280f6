package request

// Place is a place in a pool's fair order, reserved for a request that
// waits at the door before its workflow starts (admission.Gate.Reserve).
// The request carries it into its workflow, whose first admission queues
// at it (admission.Request.Place), or the door gives it back
// (admission.Gate.Unreserve). Its JSON is part of the chat workflow's
// input.
type Place struct {
	Pool   string
	Tenant string
	Weight int
	// Cost is the request's, as admission.Gate.Enqueue takes it.
	Cost float64
	// Tag is the place in the fair order; 0 is no place.
	Tag int64
	// Charge is the ticks of virtual time the place was charged, before
	// its tenant's credit: what its entry settles against (0 on places
	// reserved before it was kept: their cost/weight).
	Charge int64 `json:",omitzero"`
	// Shift is its tenant's shift when the place was reserved: the place
	// moves as much later as the tenant's streams are charged until its
	// request queues (pay as you go).
	Shift int64 `json:",omitzero"`
}
