module orchard/registry-gate

go 1.22
