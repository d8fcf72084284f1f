#include <iostream>

#include "app.hpp"

int main(int argc, char** argv) {
  return ferry::cli::run_cli(argc, argv, std::cout, std::cerr);
}
