package conn

import (
	"context"
	"crypto/tls"
	"net"
	"strings"
	"sync"
	"testing"

	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
)

// Address, namespace, API key and TLS reach the client options; an API
// key without TLS stays without it (the SDK would turn it on).
func TestTemporalOptions(t *testing.T) {
	pki := newTestPKI(t)
	t.Run("plain", func(t *testing.T) {
		o, err := TemporalOptions(Temporal{HostPort: "127.0.0.1:7233", Namespace: "default"})
		if err != nil {
			t.Fatal(err)
		}
		if o.HostPort != "127.0.0.1:7233" || o.Namespace != "default" || o.Credentials != nil || o.ConnectionOptions.TLS != nil {
			t.Fatalf("options %+v", o)
		}
	})
	t.Run("Temporal Cloud with an API key", func(t *testing.T) {
		o, err := TemporalOptions(Temporal{HostPort: "us-east-1.aws.api.temporal.io:7233", Namespace: "sluice.a1b2c", APIKey: "key-1", TLS: TLS{Enabled: true}})
		if err != nil {
			t.Fatal(err)
		}
		if o.HostPort != "us-east-1.aws.api.temporal.io:7233" || o.Namespace != "sluice.a1b2c" || o.Credentials == nil {
			t.Fatalf("options %+v", o)
		}
		if tc := o.ConnectionOptions.TLS; tc == nil || tc.InsecureSkipVerify || tc.RootCAs != nil || tc.MinVersion != tls.VersionTLS12 {
			t.Fatalf("an API key wants TLS with the system's roots, got %+v", tc)
		}
	})
	t.Run("mTLS", func(t *testing.T) {
		o, err := TemporalOptions(Temporal{HostPort: "sluice.a1b2c.tmprl.cloud:7233", Namespace: "sluice.a1b2c",
			TLS: TLS{Enabled: true, CAFile: pki.CA, ServerName: "temporal.internal", CertFile: pki.ClientCert, KeyFile: pki.ClientKey}})
		if err != nil {
			t.Fatal(err)
		}
		tc := o.ConnectionOptions.TLS
		if o.Credentials != nil || tc == nil || tc.RootCAs == nil || tc.ServerName != "temporal.internal" || len(tc.Certificates) != 1 {
			t.Fatalf("options %+v, tls %+v", o, tc)
		}
	})
	t.Run("API key without TLS", func(t *testing.T) {
		o, err := TemporalOptions(Temporal{HostPort: "mine:7233", Namespace: "default", APIKey: "k"})
		if err != nil {
			t.Fatal(err)
		}
		if o.Credentials == nil || o.ConnectionOptions.TLS != nil || !o.ConnectionOptions.TLSDisabled {
			t.Fatalf("options %+v", o)
		}
	})
	t.Run("unreadable CA", func(t *testing.T) {
		_, err := TemporalOptions(Temporal{HostPort: "127.0.0.1:7233", TLS: TLS{Enabled: true, CAFile: "/nonexistent/ca.pem"}})
		if err == nil || !strings.HasPrefix(err.Error(), "temporal.tls.ca_file: open /nonexistent/ca.pem") {
			t.Fatalf("error %v, want it to name temporal.tls.ca_file", err)
		}
	})
}

// frontend is a stand-in Temporal frontend that records the metadata of
// the GetSystemInfo call every client makes when it connects.
type frontend struct {
	workflowservice.UnimplementedWorkflowServiceServer
	mu sync.Mutex
	md metadata.MD
}

func (f *frontend) GetSystemInfo(ctx context.Context, _ *workflowservice.GetSystemInfoRequest) (*workflowservice.GetSystemInfoResponse, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	f.mu.Lock()
	f.md = md
	f.mu.Unlock()
	return &workflowservice.GetSystemInfoResponse{}, nil
}

// A client with an API key and a private CA connects over TLS and presents the key as a bearer token, as Temporal
// Cloud expects.
func TestTemporalAPIKeyOverTLS(t *testing.T) {
	pki := newTestPKI(t)
	cert, err := tls.LoadX509KeyPair(pki.ServerCert, pki.ServerKey)
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})))
	fe := &frontend{}
	workflowservice.RegisterWorkflowServiceServer(srv, fe)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)

	o, err := TemporalOptions(Temporal{HostPort: lis.Addr().String(), Namespace: "sluice.a1b2c", APIKey: "key-1", TLS: TLS{Enabled: true, CAFile: pki.CA}})
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.Dial(o)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	c.Close()
	fe.mu.Lock()
	defer fe.mu.Unlock()
	if got := fe.md.Get("authorization"); len(got) != 1 || got[0] != "Bearer key-1" {
		t.Fatalf("authorization %q, want Bearer key-1", got)
	}

	// Without the private CA the same server is refused.
	o, err = TemporalOptions(Temporal{HostPort: lis.Addr().String(), Namespace: "default", APIKey: "key-1", TLS: TLS{Enabled: true}})
	if err != nil {
		t.Fatal(err)
	}
	if c, err := client.Dial(o); err == nil {
		c.Close()
		t.Fatal("dial trusting only the system's CAs succeeded")
	}
}
