/* A shared library without keel_plugin_entry: the host must say "not a Keel plugin?". */
int not_a_plugin_function(void) { return 42; }
