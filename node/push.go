package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"
)

// registry pushes blobs and manifests to Orchard's in-cluster registry over the OCI
// distribution API (plain HTTP: the registry is cluster-internal, reachable by the
// service, this helper and the nodes only).
type registry struct {
	base   *url.URL // e.g. http://10.96.0.50:5000
	client *http.Client
}

func newRegistry(raw string) (*registry, error) {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("the registry %q is not an http(s) URL", raw)
	}
	return &registry{base: u, client: &http.Client{Timeout: 30 * time.Minute}}, nil
}

func (r *registry) url(path string) string { return r.base.JoinPath(path).String() }

func (r *registry) do(req *http.Request, want ...int) (*http.Response, error) {
	resp, err := r.client.Do(req)
	if err != nil {
		return nil, fail(http.StatusServiceUnavailable, "registry_unavailable", err.Error())
	}
	for _, w := range want {
		if resp.StatusCode == w {
			return resp, nil
		}
	}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	resp.Body.Close()
	return nil, fail(http.StatusServiceUnavailable, "registry_unavailable",
		fmt.Sprintf("%s %s: HTTP %d %s", req.Method, req.URL.Path, resp.StatusCode, bytes.TrimSpace(body)))
}

// has says whether the repository already holds the blob (pushed before: content-addressed).
func (r *registry) has(repo, digest string) (bool, error) {
	req, _ := http.NewRequest(http.MethodHead, r.url("/v2/"+repo+"/blobs/"+digest), nil)
	resp, err := r.do(req, http.StatusOK, http.StatusNotFound)
	if err != nil {
		return false, err
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK, nil
}

// upload streams a blob of unknown length (a layer being made) and commits it under the
// digest `finish` returns once the stream is done: a POST, one PATCH, a PUT.
func (r *registry) upload(repo string, body io.Reader, finish func() string) error {
	req, _ := http.NewRequest(http.MethodPost, r.url("/v2/"+repo+"/blobs/uploads/"), nil)
	resp, err := r.do(req, http.StatusAccepted)
	if err != nil {
		return err
	}
	resp.Body.Close()
	loc, err := r.location(resp)
	if err != nil {
		return err
	}
	req, _ = http.NewRequest(http.MethodPatch, loc.String(), body)
	req.Header.Set("Content-Type", "application/octet-stream")
	if resp, err = r.do(req, http.StatusAccepted); err != nil {
		return err
	}
	resp.Body.Close()
	if loc, err = r.location(resp); err != nil {
		return err
	}
	q := loc.Query()
	q.Set("digest", finish())
	loc.RawQuery = q.Encode()
	req, _ = http.NewRequest(http.MethodPut, loc.String(), nil)
	if resp, err = r.do(req, http.StatusCreated); err != nil {
		return err
	}
	resp.Body.Close()
	return nil
}

// location is an upload's next URL (relative to the registry, or absolute).
func (r *registry) location(resp *http.Response) (*url.URL, error) {
	loc, err := url.Parse(resp.Header.Get("Location"))
	if err != nil || resp.Header.Get("Location") == "" {
		return nil, fail(http.StatusServiceUnavailable, "registry_unavailable", "an upload without a Location")
	}
	return r.base.ResolveReference(loc), nil
}

// pushBytes uploads a small blob (a config) unless the repository has it.
func (r *registry) pushBytes(repo string, data []byte) (string, error) {
	sum := sha256.Sum256(data)
	digest := "sha256:" + hex.EncodeToString(sum[:])
	if ok, err := r.has(repo, digest); err != nil || ok {
		return digest, err
	}
	return digest, r.upload(repo, bytes.NewReader(data), func() string { return digest })
}

// pushFile uploads a blob from the node's content store unless the repository has it.
func (r *registry) pushFile(repo, digest, file string) error {
	if ok, err := r.has(repo, digest); err != nil || ok {
		return err
	}
	f, err := os.Open(file)
	if err != nil {
		return err
	}
	defer f.Close()
	return r.upload(repo, f, func() string { return digest })
}

// putManifest stores the manifest under a tag; its digest is what the registry says.
func (r *registry) putManifest(repo, tag, mediaType string, body []byte) (string, error) {
	req, _ := http.NewRequest(http.MethodPut, r.url("/v2/"+repo+"/manifests/"+tag), bytes.NewReader(body))
	req.Header.Set("Content-Type", mediaType)
	resp, err := r.do(req, http.StatusCreated)
	if err != nil {
		return "", err
	}
	resp.Body.Close()
	sum := sha256.Sum256(body)
	digest := "sha256:" + hex.EncodeToString(sum[:])
	if got := resp.Header.Get("Docker-Content-Digest"); got != "" && !strings.EqualFold(got, digest) {
		return "", fail(http.StatusServiceUnavailable, "registry_unavailable",
			"the registry stored the manifest as "+got+", not "+digest)
	}
	return digest, nil
}
