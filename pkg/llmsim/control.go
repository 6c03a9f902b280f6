package llmsim

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/sluice-dev/sluice/pkg/tokens"
)

// A simulator control, not an OpenAI feature: a last user message that
// begins with "[llmsim answer_tokens=N]" asks for an answer whose natural
// length is N tokens, in place of the length the answer's hash would
// draw. A replayed trace needs each request to produce its recorded
// length whatever max_tokens it sends, and the control travels in the
// message because a gateway forwards the conversation as sent but not
// the client's headers or extra fields. The directive (and one space or
// newline after it) is removed before the prompt is counted and
// answered, so it costs no prompt tokens here; a gateway in front counts
// it as the text it is to it. A real model would read it as text.
const answerTokensPrefix = "[llmsim answer_tokens="

// MaxAnswerTokens bounds the directive's N; a larger or unreadable N
// leaves the message as it is, as text.
const MaxAnswerTokens = 1 << 20

// AnswerTokensDirective is the prefix of a user message that asks for an
// answer of n tokens (1..MaxAnswerTokens); max_tokens still cuts it.
func AnswerTokensDirective(n int) string { return fmt.Sprintf("%s%d] ", answerTokensPrefix, n) }

// StripAnswerTokens is the message text the simulator counts and answers
// when content begins with an answer-length directive, and that N; else
// content and 0.
func StripAnswerTokens(content string) (string, int) {
	rest, ok := strings.CutPrefix(content, answerTokensPrefix)
	if !ok {
		return content, 0
	}
	num, after, ok := strings.Cut(rest, "]")
	n, err := strconv.Atoi(num)
	if !ok || err != nil || n < 1 || n > MaxAnswerTokens || num != strconv.Itoa(n) {
		return content, 0
	}
	if after != "" && (after[0] == ' ' || after[0] == '\n') {
		after = after[1:]
	}
	return after, n
}

// takeAnswerTokens strips an answer-length directive from the last user
// message of msgs, in place, and returns its N (0: none).
func takeAnswerTokens(msgs []tokens.Message) int {
	for i := len(msgs) - 1; i >= 0; i-- {
		if msgs[i].Role != "user" {
			continue
		}
		var n int
		msgs[i].Content, n = StripAnswerTokens(msgs[i].Content)
		return n
	}
	return 0
}
