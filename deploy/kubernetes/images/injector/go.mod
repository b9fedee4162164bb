module orchard/injector

go 1.19
