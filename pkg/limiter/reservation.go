package limiter

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/sluice-dev/sluice/pkg/hashtag"
)

// reservation is one Reserve call: its arguments, encoded for the script,
// and once decided, its outcome.
type reservation struct {
	id      string
	buckets []Bucket
	keys    []string
	// parts are its buckets by group, decided one after the other; one
	// part of every bucket when the client does not split.
	parts []part

	// next is the part to decide; charged, what the parts before it took.
	next     int
	charged  []charge
	finished bool
	decision Decision
	err      error
	done     chan struct{}
}

// part is the buckets of one group of a reservation.
type part struct {
	// tag is what Redis Cluster hashes of its keys (calls are grouped by
	// it); group builds its call's reservation key in the same slot.
	tag, group string
	buckets    []int  // indexes into reservation.buckets, in order
	packed     []byte // n, then capacity, rate, cost per bucket (see reserve.lua)
}

// charge is a part that was (or, after a lost reply, may have been)
// charged: its field in a call's reservation hash.
type charge struct {
	hash  string
	field int
	part  *part
}

func (l *Limiter) encode(id string, buckets []Bucket) (*reservation, error) {
	n := len(buckets)
	if n > 255 {
		return nil, fmt.Errorf("reserve: %d buckets, at most 255", n)
	}
	r := &reservation{id: id, buckets: buckets, keys: make([]string, 0, n)}
	for i, b := range buckets {
		if !(b.Capacity > 0 && b.PerSecond > 0 && b.Cost >= 0) || math.IsInf(b.Capacity, 0) || math.IsInf(b.PerSecond, 0) || math.IsInf(b.Cost, 0) {
			return nil, fmt.Errorf("reserve: bucket %s needs finite capacity and rate > 0 and cost >= 0", b)
		}
		key := l.bucketKey(b)
		if strings.ContainsAny(key, "\n\r") {
			return nil, fmt.Errorf("reserve: bucket %s: an id may not contain a line break", b)
		}
		r.keys = append(r.keys, key)
		tag := hashtag.Of(key)
		p := len(r.parts) - 1
		if l.splits {
			p = slices.IndexFunc(r.parts, func(p part) bool { return p.tag == tag })
		}
		if p < 0 {
			r.parts = append(r.parts, part{tag: tag, group: b.group(), packed: []byte{0}})
			p = len(r.parts) - 1
		}
		pt := &r.parts[p]
		pt.buckets = append(pt.buckets, i)
		pt.packed[0]++
		for _, x := range []float64{b.Capacity, b.PerSecond, b.Cost} {
			pt.packed = binary.LittleEndian.AppendUint64(pt.packed, math.Float64bits(x))
		}
	}
	return r, nil
}

// giveBack returns all that the earlier parts of a refused request took.
// If Redis fails meanwhile, the refusal becomes an error that carries the
// reservation, so that the caller gives it back later (as after any
// failed Reserve).
func (l *Limiter) giveBack(ctx context.Context, r *reservation) {
	var errs []error
	for _, c := range r.charged {
		if _, err := l.refundPart(ctx, c.hash, strconv.Itoa(c.field), r.chargeLines(c.part), 0, 0); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		r.decision.Reservation = r.encodeCharges()
		r.err = fmt.Errorf("reserve rate limits for %s: give back what a refused request took: %w", r.id, err)
	}
}

func (r *reservation) encodeCharges() string {
	var sb strings.Builder
	if len(r.charged) == 1 {
		sb.WriteString(onePart)
	} else {
		sb.WriteString(manyParts)
	}
	for i, c := range r.charged {
		if i > 0 {
			sb.WriteString("\n")
		}
		sb.WriteString("\n" + c.hash + "\n" + strconv.Itoa(c.field))
		for _, line := range r.chargeLines(c.part) {
			sb.WriteString("\n" + line)
		}
	}
	return sb.String()
}

// chargeLines are the bucket lines of one part.
func (r *reservation) chargeLines(p *part) []string {
	out := make([]string, len(p.buckets))
	for i, bi := range p.buckets {
		b := r.buckets[bi]
		kind := " t "
		if b.Kind == Requests {
			kind = " r "
		}
		out[i] = formatFloat(b.Capacity) + " " + formatFloat(b.PerSecond) + " " + formatFloat(b.Cost) + kind + r.keys[bi]
	}
	return out
}
