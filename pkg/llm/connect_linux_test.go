package llm

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"
)

// fullListener is a loopback port whose accept queue is full: Linux drops
// the SYN of a new connection, so connecting hangs as it does to a host
// that has gone away. It returns the endpoint's URL.
func fullListener(t *testing.T) string {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	// A backlog of 0 holds one connection that is never accepted.
	if err := syscall.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", sa.(*syscall.SockaddrInet4).Port)
	for range 8 {
		conn, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err != nil {
			return "http://" + addr
		}
		t.Cleanup(func() { _ = conn.Close() })
	}
	t.Skip("the accept queue never filled; connects do not hang on this kernel")
	return ""
}

func TestConnectDeadline(t *testing.T) {
	url := fullListener(t)
	c, err := NewOpenAI(OpenAIOptions{Endpoints: []string{url}, Deadlines: Deadlines{Connect: 150 * time.Millisecond, FirstToken: 10 * time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	_, err = c.Stream(context.Background(), Request{}, func(Delta) error { return nil })
	var e *Error
	if !errors.As(err, &e) || e.Deadline != DeadlineConnect || !e.Retryable {
		t.Fatalf("err %v (%+v), want a retryable connect deadline", err, e)
	}
	if !strings.Contains(err.Error(), url) || !strings.Contains(err.Error(), "connect deadline: no connection within 150ms") {
		t.Errorf("error %q should name the endpoint and the deadline", err)
	}
	// Well under the first-token deadline: the dial gave up, not the stream.
	if took := time.Since(began); took > 2*time.Second {
		t.Errorf("connect deadline of 150ms took %s", took)
	}
}
