// Test extension for rpc/turn_real_test.go: registers the command /probe,
// which does nothing. A prompt "/probe" is consumed by it: pi acknowledges
// the prompt and starts no run.
export default function (pi: any) {
	pi.registerCommand("probe", {
		description: "Does nothing (agenthost test).",
		handler: async (_args: string, _ctx: any) => {},
	});
}
