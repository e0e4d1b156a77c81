package server

import (
	_ "embed"
	"net/http"
)

// openAPI is the API's OpenAPI 3.1 document; TestOpenAPIMatchesRoutes
// keeps it true to the routes and their statuses.
//
//go:embed openapi.json
var openAPI []byte

func serveOpenAPI(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(openAPI)
}
