package main

import (
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"time"
)

var (
	repositoryRe = regexp.MustCompile(`^[a-z0-9]+([._-][a-z0-9]+)*(/[a-z0-9]+([._-][a-z0-9]+)*)*$`)
	tagRe        = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$`)
)

// commitRequest names the image the container runs and where its snapshot goes.
type commitRequest struct {
	// The container's image as the kubelet reports it (status.containerStatuses[].imageID):
	// "name@sha256:<manifest>" or the image ID "sha256:<config>".
	Image      string `json:"image"`
	Repository string `json:"repository"` // in the helper's registry, e.g. orchard/snapshots
	Tag        string `json:"tag"`        // e.g. the snapshot's id
}

// commitAnswer is the image made: the container's image with one layer more.
type commitAnswer struct {
	Digest string    `json:"digest"` // the manifest's, in the registry
	Config string    `json:"config"`
	Base   string    `json:"base"` // the manifest of the image it was made on
	Layer  layerInfo `json:"layer"`
	TookMS float64   `json:"took_ms"`
}

// POST /v1/pods/{pod}/containers/{container}/commit
//
// The container's changes (its upper dir) become a gzipped OCI layer on top of its image,
// pushed with that image's layers (from the node's content store, unless the registry has
// them: blobs are content-addressed, so shared layers are stored and sent once) and a
// config and manifest naming them all. The container is frozen while its layer is
// written, so the layer is one moment's files (it stays frozen if it was paused).
func (n *node) commit(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	ans, err := n.commitContainer(r.PathValue("pod"), r.PathValue("container"), r.Body)
	if err != nil {
		writeError(w, err)
		return
	}
	ans.TookMS = ms(time.Since(start))
	writeJSON(w, http.StatusOK, ans)
}

func (n *node) commitContainer(pod, ctr string, body io.Reader) (commitAnswer, error) {
	var req commitRequest
	if err := json.NewDecoder(io.LimitReader(body, 64<<10)).Decode(&req); err != nil {
		return commitAnswer{}, fail(http.StatusBadRequest, "invalid_request", "the body is not a commit request: "+err.Error())
	}
	if !repositoryRe.MatchString(req.Repository) || !tagRe.MatchString(req.Tag) {
		return commitAnswer{}, fail(http.StatusBadRequest, "invalid_request", "a repository and a tag are required")
	}
	if n.registry == nil {
		return commitAnswer{}, fail(http.StatusNotImplemented, "no_registry",
			"this helper has no registry to push to (--registry, ORCHARD_NODE_REGISTRY)")
	}
	root, _, err := n.containerRoot(pod, ctr)
	if err != nil {
		return commitAnswer{}, err
	}
	base, baseDigest, err := n.content.image(req.Image)
	if err != nil {
		return commitAnswer{}, err
	}
	config, err := n.content.read(base.Config.Digest)
	if err != nil {
		return commitAnswer{}, err
	}
	for _, l := range base.Layers {
		if err := n.registry.pushFile(req.Repository, l.Digest, n.content.path(l.Digest)); err != nil {
			return commitAnswer{}, err
		}
	}
	layer, err := n.pushLayer(pod, ctr, req.Repository, root)
	if err != nil {
		return commitAnswer{}, err
	}
	config, err = withLayer(config, layer, req.Tag)
	if err != nil {
		return commitAnswer{}, err
	}
	configDigest, err := n.registry.pushBytes(req.Repository, config)
	if err != nil {
		return commitAnswer{}, err
	}
	m := manifest{
		SchemaVersion: 2,
		MediaType:     base.MediaType,
		Config:        descriptor{MediaType: base.Config.MediaType, Digest: configDigest, Size: int64(len(config))},
		Layers: append(append([]descriptor{}, base.Layers...),
			descriptor{MediaType: gzipLayerType(base), Digest: layer.Digest, Size: layer.Size}),
	}
	if m.MediaType == "" {
		m.MediaType = ociManifest
	}
	raw, err := json.Marshal(m)
	if err != nil {
		return commitAnswer{}, err
	}
	digest, err := n.registry.putManifest(req.Repository, req.Tag, m.MediaType, raw)
	if err != nil {
		return commitAnswer{}, err
	}
	return commitAnswer{Digest: digest, Config: configDigest, Base: baseDigest, Layer: layer}, nil
}

const (
	ociManifest      = "application/vnd.oci.image.manifest.v1+json"
	dockerManifest   = "application/vnd.docker.distribution.manifest.v2+json"
	ociLayerGzip     = "application/vnd.oci.image.layer.v1.tar+gzip"
	dockerLayerGzip  = "application/vnd.docker.image.rootfs.diff.tar.gzip"
	layerCreatedBy   = "orchard: the sandbox's changes (node helper commit)"
	maxConfigHistory = 10000
)

// gzipLayerType is the gzipped layer's media type in the base manifest's own dialect.
func gzipLayerType(base manifest) string {
	if base.MediaType == dockerManifest {
		return dockerLayerGzip
	}
	return ociLayerGzip
}

// pushLayer writes the upper dir as a layer straight into an upload, the container
// frozen meanwhile (unless it already is: a paused sandbox stays paused).
func (n *node) pushLayer(pod, ctr, repo string, root overlayRoot) (layerInfo, error) {
	cg, err := n.findContainer(pod, ctr)
	if err != nil {
		return layerInfo{}, err
	}
	if frozen, err := cg.frozen(); err != nil {
		return layerInfo{}, err
	} else if !frozen {
		if err := freeze(cg, n.freezeTimeout); err != nil {
			return layerInfo{}, err
		}
		defer func() { _ = thaw(cg, n.freezeTimeout) }()
	}
	pr, pw := io.Pipe()
	var info layerInfo
	var werr error
	done := make(chan struct{})
	go func() {
		defer close(done)
		info, werr = writeLayer(pw, root.upper, root.points)
		pw.CloseWithError(werr)
	}()
	err = n.registry.upload(repo, pr, func() string { <-done; return info.Digest })
	_ = pr.CloseWithError(io.ErrClosedPipe) // the writer stops if the upload failed early
	<-done
	if werr != nil {
		return layerInfo{}, werr
	}
	return info, err
}

// withLayer is the image config with the new layer's diff ID (and a history entry).
func withLayer(config []byte, layer layerInfo, tag string) ([]byte, error) {
	var c map[string]any
	if err := json.Unmarshal(config, &c); err != nil {
		return nil, fail(http.StatusNotImplemented, "not_a_manifest", "the image config is not JSON")
	}
	rootfs, _ := c["rootfs"].(map[string]any)
	if rootfs == nil {
		return nil, fail(http.StatusNotImplemented, "not_a_manifest", "the image config has no rootfs")
	}
	ids, _ := rootfs["diff_ids"].([]any)
	rootfs["diff_ids"] = append(ids, layer.DiffID)
	now := time.Now().UTC().Format(time.RFC3339Nano)
	c["created"] = now
	if hist, ok := c["history"].([]any); ok && len(hist) < maxConfigHistory {
		c["history"] = append(hist, map[string]any{"created": now, "created_by": layerCreatedBy, "comment": tag})
	}
	return json.Marshal(c)
}
