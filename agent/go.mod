module github.com/orchard-env/orchard/agent

go 1.19
