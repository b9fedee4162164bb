package main

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
)

var digestRe = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)

// manifest is an image manifest (OCI, or Docker's schema 2, which has the same fields).
type manifest struct {
	SchemaVersion int               `json:"schemaVersion"`
	MediaType     string            `json:"mediaType,omitempty"`
	Config        descriptor        `json:"config"`
	Layers        []descriptor      `json:"layers"`
	Annotations   map[string]string `json:"annotations,omitempty"`
}

type descriptor struct {
	MediaType string `json:"mediaType"`
	Digest    string `json:"digest"`
	Size      int64  `json:"size"`
}

// contentStore reads containerd's content store on the node: the blobs of every image
// it pulled or imported (manifests, configs, layers), by digest.
type contentStore struct {
	root string // <containerd root>/io.containerd.content.v1.content, as the helper sees it

	mu       sync.Mutex
	byConfig map[string]string // config digest -> a manifest digest naming it
}

func (c *contentStore) path(digest string) string {
	return filepath.Join(c.root, "blobs", "sha256", strings.TrimPrefix(digest, "sha256:"))
}

func (c *contentStore) read(digest string) ([]byte, error) {
	if !digestRe.MatchString(digest) {
		return nil, fail(http.StatusBadRequest, "invalid_request", "not a sha256 digest: "+digest)
	}
	data, err := os.ReadFile(c.path(digest))
	if os.IsNotExist(err) {
		return nil, fail(http.StatusNotImplemented, "blob_missing",
			"blob "+digest+" is not in the node's content store (a pruned or lazily pulled image?)")
	}
	return data, err
}

// image finds the manifest of the image a container runs. The kubelet reports an image
// either by a repository digest ("name@sha256:<manifest>") or, for an image with none
// (imported, not pulled), by its ID, the digest of its config: then the manifest is the
// one in the store that names that config.
func (c *contentStore) image(imageID string) (manifest, string, error) {
	ref := imageID
	if _, d, ok := strings.Cut(imageID, "@"); ok {
		ref = d
	} else if d, err := c.manifestOf(imageID); err != nil {
		return manifest{}, "", err
	} else {
		ref = d
	}
	raw, err := c.read(ref)
	if err != nil {
		return manifest{}, "", err
	}
	var m manifest
	if err := json.Unmarshal(raw, &m); err != nil || m.Config.Digest == "" {
		return manifest{}, "", fail(http.StatusNotImplemented, "not_a_manifest",
			imageID+" is not a single-platform image manifest")
	}
	return m, ref, nil
}

// manifestOf looks through the store for a manifest whose config is this digest.
func (c *contentStore) manifestOf(config string) (string, error) {
	if !digestRe.MatchString(config) {
		return "", fail(http.StatusBadRequest, "invalid_request", "not an image id or digest: "+config)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if d, ok := c.byConfig[config]; ok {
		return d, nil
	}
	if c.byConfig == nil {
		c.byConfig = map[string]string{}
	}
	entries, err := os.ReadDir(filepath.Join(c.root, "blobs", "sha256"))
	if err != nil {
		return "", err
	}
	for _, e := range entries {
		info, err := e.Info()
		if err != nil || info.Size() > 4<<20 { // manifests are small; layers are not read
			continue
		}
		raw, err := os.ReadFile(filepath.Join(c.root, "blobs", "sha256", e.Name()))
		if err != nil || len(raw) == 0 || raw[0] != '{' {
			continue
		}
		var m manifest
		if json.Unmarshal(raw, &m) == nil && m.Config.Digest != "" && len(m.Layers) > 0 {
			c.byConfig[m.Config.Digest] = "sha256:" + e.Name()
		}
	}
	if d, ok := c.byConfig[config]; ok {
		return d, nil
	}
	return "", fail(http.StatusNotImplemented, "blob_missing",
		"no manifest in the node's content store names image "+config)
}
