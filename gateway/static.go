package gateway

import (
	"net/http"
	"strings"

	"github.com/gofiber/fiber/v2"
)

// page serves one page from Deps.Static.
func (s *Server) page(path string) fiber.Handler {
	return func(c *fiber.Ctx) error { return s.sendStatic(c, path) }
}

// salePage is GET /sales/{saleId}: the shopper page.
func (s *Server) salePage(c *fiber.Ctx) error {
	if _, ok := parseID(c.Params("saleId")); !ok {
		return errNotFound
	}
	return s.sendStatic(c, c.Path())
}

// asset is GET /assets/*.
func (s *Server) asset(c *fiber.Ctx) error {
	p := c.Params("*")
	if !validAssetPath(p) {
		return errNotFound
	}
	return s.sendStatic(c, "/assets/"+p)
}

// validAssetPath refuses empty, absolute and dot segments.
func validAssetPath(p string) bool {
	if p == "" || len(p) > 256 || p[0] == '/' || strings.ContainsAny(p, "\\\x00?#") {
		return false
	}
	for seg := range strings.SplitSeq(p, "/") {
		if seg == "" || seg == "." || seg == ".." {
			return false
		}
	}
	return true
}

// sendStatic answers with a static file, honouring Accept-Encoding: gzip
// and If-None-Match (304) against the tag of the representation chosen.
func (s *Server) sendStatic(c *fiber.Ctx, path string) error {
	if s.d.Static == nil {
		return errNotFound
	}
	f, ok := s.d.Static.Lookup(path)
	if !ok {
		return errNotFound
	}
	return sendFile(c, f)
}

// sendFile answers with f, honouring Accept-Encoding: gzip and
// If-None-Match (304) against the tag of the representation chosen.
func sendFile(c *fiber.Ctx, f StaticFile) error {
	h := &c.Response().Header
	body, etag := f.Body, f.ETag
	gz := f.Gzip != nil && acceptsGzip(c.Get(fiber.HeaderAcceptEncoding))
	if gz {
		body = f.Gzip
		if f.GzipETag != "" {
			etag = f.GzipETag
		}
	}
	if f.Gzip != nil {
		h.Add(fiber.HeaderVary, fiber.HeaderAcceptEncoding)
	}
	if etag != "" {
		h.Set(fiber.HeaderETag, etag)
	}
	if f.CacheControl != "" {
		h.Set(fiber.HeaderCacheControl, f.CacheControl)
	}
	if etag != "" && etagMatch(c.Get(fiber.HeaderIfNoneMatch), etag) {
		c.Status(http.StatusNotModified)
		return nil
	}
	h.SetContentType(f.ContentType)
	if gz {
		h.Set(fiber.HeaderContentEncoding, "gzip")
	}
	return c.Send(body)
}

// etagMatch reports whether an If-None-Match value matches etag (weak
// comparison, as RFC 9110 asks for If-None-Match).
func etagMatch(header, etag string) bool {
	if header == "" {
		return false
	}
	want := strings.TrimPrefix(etag, "W/")
	for part := range strings.SplitSeq(header, ",") {
		part = strings.TrimSpace(part)
		if part == "*" || strings.TrimPrefix(part, "W/") == want {
			return true
		}
	}
	return false
}

// acceptsGzip reports whether an Accept-Encoding value allows gzip.
func acceptsGzip(header string) bool {
	for part := range strings.SplitSeq(header, ",") {
		name, params, _ := strings.Cut(strings.TrimSpace(part), ";")
		name = strings.TrimSpace(name)
		if !strings.EqualFold(name, "gzip") && name != "*" {
			continue
		}
		q := strings.ReplaceAll(strings.TrimSpace(params), " ", "")
		if q == "q=0" || q == "q=0.0" || q == "q=0.00" || q == "q=0.000" {
			return false
		}
		return true
	}
	return false
}
