def greeting(name: str) -> str:
    return "Hello, " + name[::-1] + "!"


if __name__ == "__main__":
    print(greeting("world"))
