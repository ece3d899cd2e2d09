// adaptiveload._C: an empty Python module. Importing it loads this shared library, whose static
// TORCH_LIBRARY registrations make the ops available under torch.ops.adaptiveload.
#include <Python.h>

extern "C" {
PyMODINIT_FUNC PyInit__C(void) {
  static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr};
  return PyModule_Create(&module);
}
}
