package conn

import (
	"context"
	"crypto/tls"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"

	"github.com/sluice-dev/sluice/pkg/config"
)

// temporalOptions is TemporalOptions of the configuration Load makes of
// file (YAML, may be empty) and environ.
func temporalOptions(t *testing.T, file string, environ []string) (client.Options, error) {
	t.Helper()
	path := ""
	if file != "" {
		path = filepath.Join(t.TempDir(), "sluice.yaml")
		if err := os.WriteFile(path, []byte(file), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	cfg, err := config.Load(path, environ)
	if err != nil {
		t.Fatal(err)
	}
	return TemporalOptions(cfg.Temporal)
}

// The standard TEMPORAL_* variables reach the client options, under
// Sluice's own settings and over the defaults.
func TestTemporalOptionsFromEnv(t *testing.T) {
	pki := newTestPKI(t)
	t.Run("defaults", func(t *testing.T) {
		o, err := temporalOptions(t, "", nil)
		if err != nil {
			t.Fatal(err)
		}
		if o.HostPort != "127.0.0.1:7233" || o.Namespace != "default" || o.Credentials != nil || o.ConnectionOptions.TLS != nil {
			t.Fatalf("options %+v", o)
		}
	})
	t.Run("Temporal Cloud with an API key", func(t *testing.T) {
		o, err := temporalOptions(t, "", []string{
			"TEMPORAL_ADDRESS=us-east-1.aws.api.temporal.io:7233", "TEMPORAL_NAMESPACE=sluice.a1b2c", "TEMPORAL_API_KEY=key-1",
		})
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
	t.Run("mTLS from TEMPORAL_TLS_*", func(t *testing.T) {
		o, err := temporalOptions(t, "", []string{
			"TEMPORAL_ADDRESS=sluice.a1b2c.tmprl.cloud:7233",
			"TEMPORAL_TLS_SERVER_CA_CERT_PATH=" + pki.CA, "TEMPORAL_TLS_SERVER_NAME=temporal.internal",
			"TEMPORAL_TLS_CLIENT_CERT_PATH=" + pki.ClientCert, "TEMPORAL_TLS_CLIENT_KEY_PATH=" + pki.ClientKey,
		})
		if err != nil {
			t.Fatal(err)
		}
		tc := o.ConnectionOptions.TLS
		if o.Credentials != nil || tc == nil || tc.RootCAs == nil || tc.ServerName != "temporal.internal" || len(tc.Certificates) != 1 {
			t.Fatalf("options %+v, tls %+v", o, tc)
		}
	})
	t.Run("Sluice's settings win", func(t *testing.T) {
		o, err := temporalOptions(t, "temporal:\n  host_port: mine:7233\n  tls:\n    enabled: false\n",
			[]string{"TEMPORAL_ADDRESS=theirs:7233", "TEMPORAL_NAMESPACE=theirs", "TEMPORAL_API_KEY=k", "TEMPORAL_TLS_SERVER_NAME=theirs"})
		if err != nil {
			t.Fatal(err)
		}
		if o.HostPort != "mine:7233" || o.Namespace != "theirs" || o.Credentials == nil || o.ConnectionOptions.TLS != nil || !o.ConnectionOptions.TLSDisabled {
			t.Fatalf("options %+v", o)
		}
	})
	t.Run("unreadable CA", func(t *testing.T) {
		_, err := temporalOptions(t, "", []string{"TEMPORAL_TLS_SERVER_CA_CERT_PATH=/nonexistent/ca.pem"})
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

// A client built from TEMPORAL_ADDRESS, TEMPORAL_API_KEY and a private CA
// connects over TLS and presents the key as a bearer token, as Temporal
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

	o, err := temporalOptions(t, "", []string{
		"TEMPORAL_ADDRESS=" + lis.Addr().String(), "TEMPORAL_NAMESPACE=sluice.a1b2c",
		"TEMPORAL_API_KEY=key-1", "TEMPORAL_TLS_SERVER_CA_CERT_PATH=" + pki.CA,
	})
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
	o, err = temporalOptions(t, "", []string{"TEMPORAL_ADDRESS=" + lis.Addr().String(), "TEMPORAL_API_KEY=key-1"})
	if err != nil {
		t.Fatal(err)
	}
	if c, err := client.Dial(o); err == nil {
		c.Close()
		t.Fatal("dial trusting only the system's CAs succeeded")
	}
}
