// Package apidoc embeds shop's OpenAPI description and serves it at
// /openapi.yaml. Tests in cmd/shop check the handlers' real responses
// against it, so it cannot drift from what the service does.
package apidoc

import (
	_ "embed"
	"net/http"

	"github.com/gin-gonic/gin"
)

// Spec is openapi.yaml, OpenAPI 3.0.
//
//go:embed openapi.yaml
var Spec []byte

// Register serves Spec at GET /openapi.yaml.
func Register(r gin.IRoutes) {
	r.GET("/openapi.yaml", func(c *gin.Context) {
		c.Data(http.StatusOK, "application/yaml", Spec)
	})
}
