package llmsim

import "strings"

// planReply writes the scripts of a request's answers. A request that
// continues its final assistant message (continue_final_message) gets the
// rest of the answer that message began: answers are deterministic, so
// the answer to the conversation before it is known, and when the prefix
// is that answer's beginning the continuation is exactly the text the
// uninterrupted answer would have gone on with, token for token, cut by
// the same budget counted from the answer's start. That is what lets a
// gateway that fails a stream over to another replica be checked for
// repeated or missing text. start is the answer token the reply begins
// at.
func (s *Server) planReply(p parsedChat, budget int) (scripts []script, start int) {
	if p.prefix == nil {
		return s.plan(p.msgs, p.gen, budget, p.n), 0
	}
	before := p.msgs[:len(p.msgs)-1]
	whole := s.plan(before, p.gen, s.cfg.contextTokens(), 1)[0]
	from, cut, ok := whole.find(*p.prefix)
	if !ok {
		// A prefix this model would not have written: it goes on with an
		// answer drawn from the whole conversation, prefix included, as a
		// continuation (each token after a space).
		sc := s.plan(p.msgs, p.gen, budget+1, 1)[0]
		return []script{sc.from(1, 0)}, 1
	}
	sc := s.plan(before, p.gen, from+budget, 1)[0]
	return []script{sc.from(from, cut)}, from
}

// find locates the end of prefix in the answer: the token it ends in
// (from) and how many bytes of that token it already holds (cut, 0 when
// it ends on a token boundary). ok is false when the answer does not
// begin with prefix.
func (sc script) find(prefix string) (from, cut int, ok bool) {
	matched := 0
	for pos := range sc.target {
		if matched == len(prefix) {
			return pos, 0, true
		}
		tok, rest := sc.out.token(pos), prefix[matched:]
		switch {
		case strings.HasPrefix(rest, tok):
			matched += len(tok)
		case strings.HasPrefix(tok, rest):
			return pos, len(rest), true
		default:
			return 0, 0, false
		}
	}
	return sc.target, 0, matched == len(prefix)
}

// from is the script of the answer's rest from token k, whose first cut
// bytes the client already has. A prefix that is already the whole answer
// leaves one empty token, so that the sequence still finishes.
func (sc script) from(k, cut int) script {
	rest := sc
	rest.out = continued{src: sc.out, from: k, cut: cut, end: sc.target}
	rest.target = max(1, sc.target-k)
	return rest
}

// continued is an answer's output from token from on, the first one
// without its first cut bytes.
type continued struct {
	src            output
	from, cut, end int
}

func (c continued) token(pos int) string {
	at := c.from + pos
	if at >= c.end {
		return ""
	}
	tok := c.src.token(at)
	if pos == 0 {
		return tok[min(c.cut, len(tok)):]
	}
	return tok
}
