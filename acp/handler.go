package acp

import (
	"context"
	"encoding/json"
	"errors"

	sdk "github.com/coder/acp-go-sdk"
)

// PermissionRequest is the agent's session/request_permission, as the
// Permission callback sees it.
type PermissionRequest struct {
	SessionID  string
	ToolCallID string
	// Title is the tool call's title ("" if the agent sent none); Kind its
	// tool kind ("execute", "edit", ...).
	Title, Kind string
	// RawInput is the tool call's input as the agent sent it (JSON; nil
	// if none). The callback bounds and redacts it before showing it.
	RawInput json.RawMessage
	Options  []sdk.PermissionOption
}

// sdkClient is the Client as the SDK calls it.
type sdkClient Client

var _ sdk.Client = (*sdkClient)(nil)

// errNoTerminal answers terminal/* requests: terminals are not advertised.
var errNoTerminal = sdk.NewMethodNotFound("terminal/* (not advertised by this client)")

func (s *sdkClient) RequestPermission(ctx context.Context, p sdk.RequestPermissionRequest) (sdk.RequestPermissionResponse, error) {
	c := (*Client)(s)
	if !c.enter() {
		return sdk.RequestPermissionResponse{}, ErrClosed
	}
	defer c.handlers.Done()
	req := PermissionRequest{SessionID: string(p.SessionId), ToolCallID: string(p.ToolCall.ToolCallId), Options: p.Options}
	if p.ToolCall.Title != nil {
		req.Title = *p.ToolCall.Title
	}
	if p.ToolCall.Kind != nil {
		req.Kind = string(*p.ToolCall.Kind)
	}
	if p.ToolCall.RawInput != nil {
		req.RawInput, _ = json.Marshal(p.ToolCall.RawInput)
	}
	allow := false
	if c.opts.Permission != nil {
		dctx, cancel := context.WithTimeout(ctx, c.opts.PermissionTimeout)
		allow = c.opts.Permission(dctx, req)
		// An answer that came after the deadline does not count.
		if dctx.Err() != nil {
			allow = false
		}
		cancel()
	}
	return sdk.RequestPermissionResponse{Outcome: pick(p.Options, allow)}, nil
}

// pick chooses the option that says allow (or deny) once, else always;
// a denial with no reject option is the cancelled outcome.
func pick(opts []sdk.PermissionOption, allow bool) sdk.RequestPermissionOutcome {
	kinds := []sdk.PermissionOptionKind{sdk.PermissionOptionKindRejectOnce, sdk.PermissionOptionKindRejectAlways}
	if allow {
		kinds = []sdk.PermissionOptionKind{sdk.PermissionOptionKindAllowOnce, sdk.PermissionOptionKindAllowAlways}
	}
	for _, k := range kinds {
		for _, o := range opts {
			if o.Kind == k {
				return sdk.RequestPermissionOutcome{Selected: &sdk.RequestPermissionOutcomeSelected{OptionId: o.OptionId, Outcome: "selected"}}
			}
		}
	}
	return sdk.RequestPermissionOutcome{Cancelled: &sdk.RequestPermissionOutcomeCancelled{Outcome: "cancelled"}}
}

// SessionUpdate is never called: updates are decoded before the SDK.
func (s *sdkClient) SessionUpdate(context.Context, sdk.SessionNotification) error { return nil }

func (s *sdkClient) ReadTextFile(ctx context.Context, p sdk.ReadTextFileRequest) (sdk.ReadTextFileResponse, error) {
	c := (*Client)(s)
	if !c.enter() {
		return sdk.ReadTextFileResponse{}, ErrClosed
	}
	defer c.handlers.Done()
	if c.fs == nil {
		return sdk.ReadTextFileResponse{}, sdk.NewMethodNotFound(sdk.ClientMethodFsReadTextFile)
	}
	text, err := c.fs.read(p.Path, p.Line, p.Limit)
	if err != nil {
		return sdk.ReadTextFileResponse{}, fsErr(err)
	}
	return sdk.ReadTextFileResponse{Content: text}, nil
}

func (s *sdkClient) WriteTextFile(ctx context.Context, p sdk.WriteTextFileRequest) (sdk.WriteTextFileResponse, error) {
	c := (*Client)(s)
	if !c.enter() {
		return sdk.WriteTextFileResponse{}, ErrClosed
	}
	defer c.handlers.Done()
	if c.fs == nil {
		return sdk.WriteTextFileResponse{}, sdk.NewMethodNotFound(sdk.ClientMethodFsWriteTextFile)
	}
	if err := c.fs.write(p.Path, p.Content); err != nil {
		return sdk.WriteTextFileResponse{}, fsErr(err)
	}
	return sdk.WriteTextFileResponse{}, nil
}

// fsErr answers an fs request with the reason but not the host's paths
// beyond what the agent sent.
func fsErr(err error) error {
	if errors.Is(err, ErrOutsideRoot) {
		return sdk.NewInvalidParams(map[string]any{"error": err.Error()})
	}
	return sdk.NewInternalError(map[string]any{"error": err.Error()})
}

func (s *sdkClient) CreateTerminal(context.Context, sdk.CreateTerminalRequest) (sdk.CreateTerminalResponse, error) {
	return sdk.CreateTerminalResponse{}, errNoTerminal
}

func (s *sdkClient) KillTerminal(context.Context, sdk.KillTerminalRequest) (sdk.KillTerminalResponse, error) {
	return sdk.KillTerminalResponse{}, errNoTerminal
}

func (s *sdkClient) TerminalOutput(context.Context, sdk.TerminalOutputRequest) (sdk.TerminalOutputResponse, error) {
	return sdk.TerminalOutputResponse{}, errNoTerminal
}

func (s *sdkClient) ReleaseTerminal(context.Context, sdk.ReleaseTerminalRequest) (sdk.ReleaseTerminalResponse, error) {
	return sdk.ReleaseTerminalResponse{}, errNoTerminal
}

func (s *sdkClient) WaitForTerminalExit(context.Context, sdk.WaitForTerminalExitRequest) (sdk.WaitForTerminalExitResponse, error) {
	return sdk.WaitForTerminalExitResponse{}, errNoTerminal
}
