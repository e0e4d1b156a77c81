package modeltest_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"net/http"
	"strings"
	"time"

	"github.com/agenthost/agenthost/modeltest"
)

// The model answers from the script in the prompt, here through its
// OpenAI-compatible chat completions API (as the agents call it).
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	model, err := modeltest.Start(ctx, modeltest.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer model.Close()

	for _, prompt := range []string{"hello", "[[say:Hi, I am scripted.]]"} {
		body, _ := json.Marshal(map[string]any{"model": "fake-model",
			"messages": []map[string]string{{"role": "user", "content": prompt}}})
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, model.URL()+"/chat/completions", strings.NewReader(string(body)))
		if err != nil {
			log.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			log.Fatal(err)
		}
		var answer struct {
			Choices []struct {
				Message struct{ Content string } `json:"message"`
			} `json:"choices"`
		}
		err = json.NewDecoder(resp.Body).Decode(&answer)
		resp.Body.Close()
		if err != nil || len(answer.Choices) == 0 {
			log.Fatal("no answer: ", err)
		}
		fmt.Println(answer.Choices[0].Message.Content)
	}
	// Output:
	// ok: hello
	// Hi, I am scripted.
}
