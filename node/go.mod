module github.com/orchard-env/orchard/node

go 1.22
