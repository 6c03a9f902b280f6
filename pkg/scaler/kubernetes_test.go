package scaler_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/pkg/scaler"
)

// fakeAPIServer answers the scale subresource of one Deployment the way the
// Kubernetes API server does: it checks the bearer token, RBAC, the path,
// the method and the patch's content type, and answers errors with a
// Status object.
type fakeAPIServer struct {
	t          *testing.T
	namespace  string
	deployment string
	token      string

	mu        sync.Mutex
	forbidden bool
	spec      int
	status    int
	requests  []string // "METHOD path body"
}

func writeStatus(w http.ResponseWriter, code int, reason, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(map[string]any{
		"kind": "Status", "apiVersion": "v1", "metadata": map[string]any{},
		"status": "Failure", "message": msg, "reason": reason, "code": code,
	})
}

func (f *fakeAPIServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.requests = append(f.requests, strings.TrimSpace(r.Method+" "+r.URL.Path+" "+string(body)))
	if r.Header.Get("Authorization") != "Bearer "+f.token {
		writeStatus(w, http.StatusUnauthorized, "Unauthorized", "Unauthorized")
		return
	}
	if r.Header.Get("Accept") != "application/json" {
		f.t.Errorf("Accept = %q, want application/json", r.Header.Get("Accept"))
	}
	parts := strings.Split(r.URL.Path, "/")
	// /apis/apps/v1/namespaces/{ns}/deployments/{name}/scale
	if len(parts) != 9 || strings.Join(parts[:5], "/") != "/apis/apps/v1/namespaces" || parts[6] != "deployments" || parts[8] != "scale" {
		writeStatus(w, http.StatusNotFound, "NotFound", "the server could not find the requested resource")
		return
	}
	verb := map[string]string{http.MethodGet: "get", http.MethodPatch: "patch"}[r.Method]
	if f.forbidden {
		writeStatus(w, http.StatusForbidden, "Forbidden", fmt.Sprintf(
			`deployments.apps %q is forbidden: User "system:serviceaccount:%s:sluice" cannot %s resource "deployments/scale" in API group "apps" in the namespace %q`,
			parts[7], f.namespace, verb, parts[5]))
		return
	}
	if parts[5] != f.namespace || parts[7] != f.deployment {
		writeStatus(w, http.StatusNotFound, "NotFound", fmt.Sprintf(`deployments.apps %q not found`, parts[7]))
		return
	}
	switch r.Method {
	case http.MethodGet:
		if len(body) != 0 {
			f.t.Errorf("GET with a body: %q", body)
		}
	case http.MethodPatch:
		if ct := r.Header.Get("Content-Type"); ct != "application/merge-patch+json" {
			writeStatus(w, http.StatusUnsupportedMediaType, "UnsupportedMediaType", fmt.Sprintf("the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml; got %q", ct))
			return
		}
		var n int
		if _, err := fmt.Sscanf(string(body), `{"spec":{"replicas":%d}}`, &n); err != nil || string(body) != fmt.Sprintf(`{"spec":{"replicas":%d}}`, n) {
			f.t.Errorf("PATCH body = %q, want exactly {\"spec\":{\"replicas\":N}}", body)
			writeStatus(w, http.StatusBadRequest, "BadRequest", "bad patch")
			return
		}
		if n < 0 {
			writeStatus(w, http.StatusUnprocessableEntity, "Invalid", fmt.Sprintf(`Scale.autoscaling %q is invalid: spec.replicas: Invalid value: %d: must be greater than or equal to 0`, f.deployment, n))
			return
		}
		f.spec = n
	default:
		writeStatus(w, http.StatusMethodNotAllowed, "MethodNotAllowed", "the server does not allow this method on the requested resource")
		return
	}
	// autoscaling/v1 Scale: spec.replicas is omitempty, status.replicas is not.
	spec := map[string]any{}
	if f.spec != 0 {
		spec["replicas"] = f.spec
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{
		"kind": "Scale", "apiVersion": "autoscaling/v1",
		"metadata": map[string]any{"name": f.deployment, "namespace": f.namespace},
		"spec":     spec,
		"status":   map[string]any{"replicas": f.status, "selector": "app=" + f.deployment},
	})
}

func (f *fakeAPIServer) log() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.requests...)
}

// serviceAccount writes a service account mount for ts: token, ca.crt
// (the test server's certificate) and namespace.
func serviceAccount(t *testing.T, ts *httptest.Server, token, namespace string) string {
	t.Helper()
	dir := t.TempDir()
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ts.Certificate().Raw})
	for name, data := range map[string][]byte{"token": []byte(token + "\n"), "ca.crt": ca, "namespace": []byte(namespace)} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func noEnv(string) (string, bool) { return "", false }

func TestKubernetes(t *testing.T) {
	const path = "/apis/apps/v1/namespaces/llm/deployments/vllm-short/scale"
	tests := []struct {
		name      string
		forbidden bool
		token     string // in the mounted file; "" means the right one
		opts      func(*scaler.KubernetesOptions)
		run       func(ctx context.Context, k *scaler.Kubernetes) error
		wantErr   error  // errors.Is target; nil means success
		wantMsg   string // in the error
		permanent bool
		requests  []string
		spec      int
	}{
		{
			name: "read",
			run: func(ctx context.Context, k *scaler.Kubernetes) error {
				c, err := k.Replicas(ctx)
				if err == nil && (c != scaler.Count{Desired: 2, Current: 2} || !c.Settled()) {
					return fmt.Errorf("count %+v", c)
				}
				return err
			},
			requests: []string{"GET " + path}, spec: 2,
		},
		{
			name: "scale up, status lags",
			run: func(ctx context.Context, k *scaler.Kubernetes) error {
				if err := k.Scale(ctx, 5, "p99/p50 = 7"); err != nil {
					return err
				}
				c, err := k.Replicas(ctx)
				if err == nil && (c != scaler.Count{Desired: 5, Current: 2} || c.Settled()) {
					return fmt.Errorf("count %+v", c)
				}
				return err
			},
			requests: []string{`PATCH ` + path + ` {"spec":{"replicas":5}}`, "GET " + path}, spec: 5,
		},
		{
			name: "same count twice is a no-op",
			run: func(ctx context.Context, k *scaler.Kubernetes) error {
				if err := k.Scale(ctx, 3, "retry"); err != nil {
					return err
				}
				return k.Scale(ctx, 3, "retry")
			},
			requests: []string{`PATCH ` + path + ` {"spec":{"replicas":3}}`, `PATCH ` + path + ` {"spec":{"replicas":3}}`}, spec: 3,
		},
		{
			name: "scale to zero, spec.replicas omitted",
			run: func(ctx context.Context, k *scaler.Kubernetes) error {
				if err := k.Scale(ctx, 0, "idle"); err != nil {
					return err
				}
				c, err := k.Replicas(ctx)
				if err == nil && c.Desired != 0 {
					return fmt.Errorf("count %+v", c)
				}
				return err
			},
			requests: []string{`PATCH ` + path + ` {"spec":{"replicas":0}}`, "GET " + path},
		},
		{
			name:    "negative refused before any request",
			run:     func(ctx context.Context, k *scaler.Kubernetes) error { return k.Scale(ctx, -1, "bug") },
			wantErr: scaler.ErrInvalid, wantMsg: "scale deployment llm/vllm-short: replica count refused: replicas must be >= 0, got -1",
			permanent: true, spec: 2,
		},
		{
			name:    "wrong deployment is not found",
			opts:    func(o *scaler.KubernetesOptions) { o.Deployment = "nope" },
			run:     func(ctx context.Context, k *scaler.Kubernetes) error { return k.Scale(ctx, 4, "") },
			wantErr: scaler.ErrNotFound, wantMsg: `scale deployment llm/nope to 4: PATCH https://127.0.0.1:`,
			permanent: true, spec: 2,
			requests: []string{`PATCH /apis/apps/v1/namespaces/llm/deployments/nope/scale {"spec":{"replicas":4}}`},
		},
		{
			name:      "no RBAC is forbidden",
			forbidden: true,
			run:       func(ctx context.Context, k *scaler.Kubernetes) error { return k.Scale(ctx, 4, "") },
			wantErr:   scaler.ErrForbidden, wantMsg: `403 Forbidden: deployments.apps "vllm-short" is forbidden: User "system:serviceaccount:llm:sluice" cannot patch resource "deployments/scale" in API group "apps" in the namespace "llm"`,
			permanent: true, spec: 2,
			requests: []string{`PATCH ` + path + ` {"spec":{"replicas":4}}`},
		},
		{
			name:    "stale token is unauthorized",
			token:   "expired",
			run:     func(ctx context.Context, k *scaler.Kubernetes) error { _, err := k.Replicas(ctx); return err },
			wantErr: scaler.ErrForbidden, wantMsg: "read replicas of deployment llm/vllm-short: GET https://", permanent: true, spec: 2,
			requests: []string{"GET " + path},
		},
		{
			name: "token is re-read on every call",
			run: func(ctx context.Context, k *scaler.Kubernetes) error {
				// The test rewrites the token file after NewKubernetes; see below.
				_, err := k.Replicas(ctx)
				return err
			},
			token: "rotated-later", spec: 2,
			requests: []string{"GET " + path},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fake := &fakeAPIServer{t: t, namespace: "llm", deployment: "vllm-short", token: "sa-token", spec: 2, status: 2, forbidden: tt.forbidden}
			ts := httptest.NewTLSServer(fake)
			t.Cleanup(ts.Close)
			token := "sa-token"
			if tt.token != "" {
				token = tt.token
			}
			dir := serviceAccount(t, ts, token, "llm")
			o := scaler.KubernetesOptions{APIServer: ts.URL, Deployment: "vllm-short", ServiceAccountDir: dir, LookupEnv: noEnv}
			if tt.opts != nil {
				tt.opts(&o)
			}
			k, err := scaler.NewKubernetes(o)
			if err != nil {
				t.Fatal(err)
			}
			if tt.token == "rotated-later" {
				if err := os.WriteFile(filepath.Join(dir, "token"), []byte("sa-token"), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			err = tt.run(context.Background(), k)
			checkErr(t, err, tt.wantErr, tt.wantMsg, tt.permanent)
			if got := fake.log(); strings.Join(got, "\n") != strings.Join(tt.requests, "\n") {
				t.Errorf("requests:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(tt.requests, "\n"))
			}
			if fake.spec != tt.spec {
				t.Errorf("spec.replicas = %d, want %d", fake.spec, tt.spec)
			}
		})
	}
}

func checkErr(t *testing.T, err, want error, msg string, permanent bool) {
	t.Helper()
	switch {
	case want == nil && err != nil:
		t.Fatalf("unexpected error: %v", err)
	case want != nil && !errors.Is(err, want):
		t.Fatalf("error = %v, want %v", err, want)
	}
	if err == nil {
		return
	}
	if !strings.Contains(err.Error(), msg) {
		t.Errorf("error %q does not contain %q", err, msg)
	}
	if scaler.Permanent(err) != permanent {
		t.Errorf("Permanent(%v) = %v, want %v", err, !permanent, permanent)
	}
}

func TestKubernetesServerErrorIsNotPermanent(t *testing.T) {
	ts := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		writeStatus(w, http.StatusServiceUnavailable, "ServiceUnavailable", "etcdserver: leader changed")
	}))
	t.Cleanup(ts.Close)
	k, err := scaler.NewKubernetes(scaler.KubernetesOptions{
		APIServer: ts.URL, Namespace: "llm", Deployment: "vllm", InsecureSkipVerify: true,
		TokenFile: filepath.Join(serviceAccount(t, ts, "x", "llm"), "token"), LookupEnv: noEnv,
	})
	if err != nil {
		t.Fatal(err)
	}
	err = k.Scale(context.Background(), 2, "")
	var se *scaler.StatusError
	if !errors.As(err, &se) || se.Code != http.StatusServiceUnavailable || se.Message != "etcdserver: leader changed" {
		t.Fatalf("error = %v, want a 503 StatusError", err)
	}
	if scaler.Permanent(err) {
		t.Errorf("a 503 must be retried")
	}
}

func TestKubernetesUntrustedServer(t *testing.T) {
	fake := &fakeAPIServer{t: t, namespace: "llm", deployment: "vllm", token: "x"}
	ts := httptest.NewTLSServer(fake)
	t.Cleanup(ts.Close)
	dir := serviceAccount(t, ts, "x", "llm")
	// Every httptest server shares one certificate, so another CA has to
	// be made here.
	if err := os.WriteFile(filepath.Join(dir, "ca.crt"), otherCA(t), 0o600); err != nil {
		t.Fatal(err)
	}
	k, err := scaler.NewKubernetes(scaler.KubernetesOptions{APIServer: ts.URL, Deployment: "vllm", ServiceAccountDir: dir, LookupEnv: noEnv})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := k.Replicas(context.Background()); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("error = %v, want a certificate error", err)
	}
	if len(fake.log()) != 0 {
		t.Errorf("request reached the server: %v", fake.log())
	}
}

func otherCA(t *testing.T) []byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "other-ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

func TestNewKubernetes(t *testing.T) {
	ts := httptest.NewTLSServer(http.NotFoundHandler())
	t.Cleanup(ts.Close)
	dir := serviceAccount(t, ts, "x", "llm")
	env := func(m map[string]string) func(string) (string, bool) {
		return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
	}
	tests := []struct {
		name string
		o    scaler.KubernetesOptions
		want string // error text; "" means success
	}{
		{"in a pod", scaler.KubernetesOptions{Deployment: "vllm", ServiceAccountDir: dir,
			LookupEnv: env(map[string]string{"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"})}, ""},
		{"IPv6 service host", scaler.KubernetesOptions{Deployment: "vllm", ServiceAccountDir: dir,
			LookupEnv: env(map[string]string{"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "443"})}, ""},
		{"not in a pod", scaler.KubernetesOptions{Deployment: "vllm", ServiceAccountDir: dir, LookupEnv: noEnv},
			"kubernetes scaler: no API server: set APIServer or run in a pod (KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT)"},
		{"no deployment", scaler.KubernetesOptions{APIServer: ts.URL, ServiceAccountDir: dir, LookupEnv: noEnv},
			`kubernetes scaler: deployment "" is not a valid name`},
		{"path in a name", scaler.KubernetesOptions{APIServer: ts.URL, Deployment: "a/../../b", ServiceAccountDir: dir, LookupEnv: noEnv},
			`kubernetes scaler: deployment "a/../../b" is not a valid name`},
		{"bad namespace", scaler.KubernetesOptions{APIServer: ts.URL, Namespace: "LLM", Deployment: "vllm", ServiceAccountDir: dir, LookupEnv: noEnv},
			`kubernetes scaler: namespace "LLM" is not a valid name`},
		{"no namespace mounted", scaler.KubernetesOptions{APIServer: ts.URL, Deployment: "vllm", ServiceAccountDir: t.TempDir(), LookupEnv: noEnv},
			"kubernetes scaler: no namespace given and none mounted: open "},
		{"no CA", scaler.KubernetesOptions{APIServer: ts.URL, Namespace: "llm", Deployment: "vllm", ServiceAccountDir: t.TempDir(), LookupEnv: noEnv},
			"kubernetes scaler: read API server CA: open "},
		{"CA not PEM", scaler.KubernetesOptions{APIServer: ts.URL, Namespace: "llm", Deployment: "vllm", ServiceAccountDir: dir, CAFile: filepath.Join(dir, "token"), LookupEnv: noEnv},
			"kubernetes scaler: read API server CA: no PEM certificate in "},
		{"insecure needs no CA", scaler.KubernetesOptions{APIServer: ts.URL, Namespace: "llm", Deployment: "vllm", ServiceAccountDir: t.TempDir(), InsecureSkipVerify: true, LookupEnv: noEnv}, ""},
		{"plain http API server", scaler.KubernetesOptions{APIServer: "ftp://x", Namespace: "llm", Deployment: "vllm", InsecureSkipVerify: true, LookupEnv: noEnv},
			`kubernetes scaler: API server: URL must be absolute http(s), got "ftp://x"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := scaler.NewKubernetes(tt.o)
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case tt.want != "" && (err == nil || !strings.HasPrefix(err.Error(), tt.want)):
				t.Fatalf("error = %v, want prefix %q", err, tt.want)
			}
		})
	}
}

// A missing token file fails the call, not the constructor: the kubelet
// may not have written it yet when the worker starts.
func TestKubernetesMissingToken(t *testing.T) {
	k, err := scaler.NewKubernetes(scaler.KubernetesOptions{
		APIServer: "https://127.0.0.1:1", Namespace: "llm", Deployment: "vllm", InsecureSkipVerify: true,
		ServiceAccountDir: t.TempDir(), LookupEnv: noEnv,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := k.Scale(context.Background(), 1, ""); err == nil || !strings.Contains(err.Error(), "scale deployment llm/vllm: read service account token: open ") {
		t.Fatalf("error = %v", err)
	}
}
