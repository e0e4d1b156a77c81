package server

import (
	"bytes"
	_ "embed"
	"encoding/json"
	"fmt"
	"net/http"
)

// openAPI is the API's OpenAPI 3.2 document; TestOpenAPIMatchesRoutes
// keeps it true to the routes and their statuses, and docs/http.md is
// generated from it (TestHTTPReference).
//
//go:embed openapi.json
var openAPI []byte

// openAPIDoc is the document as served: its info.version is the build's.
func openAPIDoc(version string) ([]byte, error) {
	var doc map[string]json.RawMessage
	if err := json.Unmarshal(openAPI, &doc); err != nil {
		return nil, fmt.Errorf("server: the OpenAPI document: %w", err)
	}
	var info map[string]json.RawMessage
	if err := json.Unmarshal(doc["info"], &info); err != nil {
		return nil, fmt.Errorf("server: the OpenAPI document's info: %w", err)
	}
	v, _ := json.Marshal(version)
	info["version"] = v
	var err error
	if doc["info"], err = json.Marshal(info); err != nil {
		return nil, err
	}
	out, err := json.Marshal(doc)
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	if err := json.Indent(&b, out, "", " "); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

func (s *Server) serveOpenAPI(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(s.openapi)
}
