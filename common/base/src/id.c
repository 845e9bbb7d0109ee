#include "fedmoe/id.h"

bool fm_id_valid(const char *id, size_t n)
{
    if (n == 0 || n > 63)
        return false;
    for (size_t i = 0; i < n; i++) {
        char ch = id[i];
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '-' ||
              ch == '_' || ch == '.'))
            return false;
    }
    return true;
}
