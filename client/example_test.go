package client_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"strings"
	"time"

	"github.com/cubicle-dev/cubicle/client"
)

// This example starts a sandbox, drives Chromium, takes a screenshot and
// tears the sandbox down.
func Example() {
	ctx := context.Background()
	c := client.New("http://127.0.0.1:7171", client.WithAPIKey(os.Getenv("CUBICLE_API_KEY")))

	sb, err := c.Create(ctx, client.CreateRequest{
		Resolution: &client.Resolution{Width: 1280, Height: 800},
		StartURL:   "https://example.org",
		Network:    &client.Network{Egress: client.EgressAll},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Destroy(context.WithoutCancel(ctx), sb.ID)

	// Focus the address bar, type a URL and go, in one round trip.
	if _, err := c.Actions(ctx, sb.ID,
		client.PressKey("ctrl+l"),
		client.TypeText("https://go.dev\n"),
		client.WaitMS(2000),
	); err != nil {
		log.Fatal(err)
	}
	png, err := c.Screenshot(ctx, sb.ID, client.ScreenshotOptions{})
	if err != nil {
		log.Fatal(err)
	}
	if err := os.WriteFile("screen.png", png, 0o644); err != nil {
		log.Fatal(err)
	}
}

func ExampleNew() {
	c := client.New("http://127.0.0.1:7171",
		client.WithAPIKey("my-key"),
		client.WithTimeout(2*time.Minute),
		client.WithRetry(5, 100*time.Millisecond),
	)
	fmt.Println(c.BaseURL())
	// Output: http://127.0.0.1:7171
}

func ExampleClient_Create_withoutWait() {
	ctx := context.Background()
	c := client.New("http://127.0.0.1:7171")
	sb, err := c.Create(ctx, client.CreateRequest{Template: "desktop"}, client.WithoutWait())
	if err != nil {
		log.Fatal(err)
	}
	for sb.State == client.StateStarting {
		time.Sleep(500 * time.Millisecond)
		if sb, err = c.Get(ctx, sb.ID); err != nil {
			log.Fatal(err)
		}
	}
	fmt.Println(sb.ID, sb.State)
}

func ExampleClient_Actions() {
	ctx := context.Background()
	c := client.New("http://127.0.0.1:7171")
	right := client.ClickAt(200, 150)
	right.Button = "right"
	resp, err := c.Actions(ctx, "sandbox-id",
		client.MoveTo(100, 100),
		right,
		client.PressKey("esc"),
		client.Action{Type: client.ActionCursorPosition},
	)
	var apiErr *client.APIError
	if errors.As(err, &apiErr) && apiErr.Index != nil {
		log.Fatalf("action %d failed: %s", *apiErr.Index, apiErr.Message)
	} else if err != nil {
		log.Fatal(err)
	}
	last := resp.Results[len(resp.Results)-1]
	fmt.Println("pointer at", last.X, last.Y)
}

func ExampleClient_ExecStream() {
	ctx := context.Background()
	c := client.New("http://127.0.0.1:7171")
	code, err := c.ExecStream(ctx, "sandbox-id", client.ExecRequest{Command: "apt-get update"},
		func(e client.ExecEvent) error {
			fmt.Print(e.Stdout)
			fmt.Fprint(os.Stderr, e.Stderr)
			return nil
		})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("exit code", code)
}

func ExampleClient_Upload() {
	ctx := context.Background()
	c := client.New("http://127.0.0.1:7171")
	// A strings.Reader can be rewound, so the upload is retried on 503.
	fi, err := c.Upload(ctx, "sandbox-id", "/root/notes.txt", strings.NewReader("hello\n"))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(fi.Path, fi.Size)
}

func ExampleIsNotFound() {
	ctx := context.Background()
	c := client.New("http://127.0.0.1:7171")
	if err := c.Destroy(ctx, "sandbox-id"); client.IsNotFound(err) {
		fmt.Println("already gone")
	} else if err != nil {
		log.Fatal(err)
	}
}
