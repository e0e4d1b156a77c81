package rpc

// Command is a request the host sends to the agent. Its JSON encoding must be
// an object without "id" and "type": the client adds both.
type Command interface {
	// CommandType is the wire "type" of the command, e.g. "get_state".
	CommandType() string
}
