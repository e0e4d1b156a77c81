package acpagent

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/agenthost/agenthost/room"
	sdk "github.com/coder/acp-go-sdk"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// toolServer serves a room's tools to its agent as an MCP server over
// streamable HTTP on loopback, behind a bearer token only that agent is
// given (ACP has no host tools; an agent that takes http MCP servers gets
// the room's tools this way).
type toolServer struct {
	url, token string
	srv        *http.Server
	done       chan struct{}
	once       sync.Once
	// mcp is the MCP server the requests get (nil: refused).
	mcp atomic.Pointer[mcp.Server]
}

// toolServerName is the MCP server's name in the agent (room.ReservedName:
// a room's own servers cannot take it).
const toolServerName = room.ReservedName

// serveTools starts the MCP server for tools.
func serveTools(tools []room.Tool, log *slog.Logger) (*toolServer, error) {
	s, err := toolsServer(tools, log)
	if err != nil {
		return nil, err
	}
	ts, err := listenTools(log)
	if err != nil {
		return nil, err
	}
	ts.mcp.Store(s)
	return ts, nil
}

// setTools makes tools the server's from now on (a warm pool's agent,
// whose server listened from its start, bound to a room).
func (ts *toolServer) setTools(tools []room.Tool, log *slog.Logger) error {
	s, err := toolsServer(tools, log)
	if err != nil {
		return err
	}
	ts.mcp.Store(s)
	return nil
}

// toolsServer is the MCP server of tools.
func toolsServer(tools []room.Tool, log *slog.Logger) (*mcp.Server, error) {
	s := mcp.NewServer(&mcp.Implementation{Name: "agenthost", Version: "dev"}, &mcp.ServerOptions{Logger: log})
	for _, t := range tools {
		schema := t.Parameters
		if len(schema) == 0 {
			schema = json.RawMessage(`{"type":"object"}`)
		}
		var obj struct {
			Type string `json:"type"`
		}
		if err := json.Unmarshal(schema, &obj); err != nil || obj.Type != "object" {
			// AddTool would panic; room.validateTools should have refused it.
			return nil, fmt.Errorf("acpagent: room tool %q: parameters are not an object schema", t.Name)
		}
		run := t.Run
		s.AddTool(&mcp.Tool{Name: t.Name, Description: t.Description, InputSchema: schema},
			func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
				text, err := run(ctx, room.ToolCall{Args: req.Params.Arguments})
				if err != nil {
					return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: err.Error()}}}, nil
				}
				return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: text}}}, nil
			})
	}
	return s, nil
}

// listenTools starts the tools' HTTP server with no MCP server yet (its
// requests are refused until one is stored).
func listenTools(log *slog.Logger) (*toolServer, error) {
	var b [24]byte
	if _, err := rand.Read(b[:]); err != nil {
		return nil, err
	}
	ts := &toolServer{token: hex.EncodeToString(b[:]), done: make(chan struct{})}
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return ts.mcp.Load() }, &mcp.StreamableHTTPOptions{Stateless: true, Logger: log})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("acpagent: room tools server: %w", err)
	}
	ts.url = "http://" + ln.Addr().String() + "/mcp"
	ts.srv = &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get("Authorization") != "Bearer "+ts.token {
				http.Error(w, "unauthorized", http.StatusUnauthorized)
				return
			}
			r.Body = http.MaxBytesReader(w, r.Body, 4<<20)
			h.ServeHTTP(w, r)
		}),
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelDebug),
	}
	go func() {
		defer close(ts.done)
		_ = ts.srv.Serve(ln)
	}()
	return ts, nil
}

// server is the MCP server entry for session/new and session/load.
func (ts *toolServer) server() sdk.McpServer {
	return sdk.McpServer{Http: &sdk.McpServerHttpInline{Type: "http", Name: toolServerName, Url: ts.url,
		Headers: []sdk.HttpHeader{{Name: "Authorization", Value: "Bearer " + ts.token}}}}
}

// port is the server's TCP port.
func (ts *toolServer) port() uint16 {
	u, err := url.Parse(ts.url)
	if err != nil {
		return 0
	}
	n, _ := strconv.ParseUint(u.Port(), 10, 16)
	return uint16(n)
}

// close stops the server; calls still running are cut off (the agent is
// gone by then).
func (ts *toolServer) close() error {
	if ts == nil {
		return nil
	}
	var err error
	ts.once.Do(func() {
		err = ts.srv.Close()
		<-ts.done
		if errors.Is(err, http.ErrServerClosed) {
			err = nil
		}
	})
	return err
}
