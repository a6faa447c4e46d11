package client_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/cubicle-dev/cubicle/client"
)

// This example prints a sandbox's newest log lines and then follows its
// log: Since = the last timestamp seen asks for exactly the lines after it.
func ExampleClient_Logs() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := client.New("http://127.0.0.1:7171")
	opts := client.LogsOptions{Limit: 20}
	for ctx.Err() == nil {
		logs, err := c.Logs(ctx, "sandbox-id", opts)
		if err != nil {
			log.Fatal(err)
		}
		for _, l := range logs {
			fmt.Println(l.Timestamp.Format(time.RFC3339), l.Source, l.Level, l.Message)
		}
		if len(logs) > 0 {
			opts.Since = logs[len(logs)-1].Timestamp
		}
		time.Sleep(2 * time.Second)
	}
}
