// Links the per-header translation units into one program.
int main() { return 0; }
